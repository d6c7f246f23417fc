/**
 * Seeded structured Q/K/V scenarios with ground truth.
 *
 * @module @crisp/synth
 */
export { type Scenario, type ScenarioOptions, type ScenarioChunk, type GroundTruth, type HeadTruth, type NeedleTruth, type HeadStrengths, scenario } from './scenario.js';
export {
  type HeadKind,
  HEAD_KINDS,
  EXPECTED_ROUTE,
  type Profile,
  type ProfileName,
  PROFILE_NAMES,
  ROUTING_FAILURE_PROFILE_NAMES,
  ALL_PROFILE_NAMES,
  PROFILES,
  getProfile,
} from './profiles.js';
export { type ScenarioTensors, type UploadOptions, allocateQkv, defaultChunkRows, uploadScenario } from './upload.js';
export {
  type CalibrateOptions,
  type CalibrateScenarioOptions,
  type CalibrationReport,
  type CalibrationSummary,
  type CalibrationTargets,
  type HeadCalibration,
  CALIBRATION_TARGETS,
  calibrate,
  calibrateScenario,
} from './calibrate.js';
export { type MaskedPlan, type NeedleHit, type NeedleRecall, needleRecall } from './needle-recall.js';
