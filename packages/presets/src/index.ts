/**
 * Ready-made policies: `crisp`, `crispFast`, `flexPrefill` and `dense`.
 *
 * @module @crisp/presets
 */
export { crisp, crispFast, dense, flexPrefill, type PresetName, presetByName, presets } from './presets.js';
