export { crisp, crispFast, dense, flexPrefill, type PresetName, presets } from './presets.js';
