/**
 * Node-only parts of @crisp/synth: scenario generation on worker threads.
 *
 * @module @crisp/synth/node
 */
export { type SynthSpec, serveSynthChunks, setSynthWorkerEntry, synthThreads, synthWorkerEntry, uploadScenarioParallel } from './workers.js';
