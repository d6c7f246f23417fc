export { crisp, crispFast, dense, flexPrefill, type PresetName, presetByName, presets } from './presets.js';
