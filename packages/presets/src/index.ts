/**
 * Ready-made policies: `crisp`, `crispFast`, `crispGuarded`, `flexPrefill` and `dense`.
 *
 * @module @crisp/presets
 */
export { crisp, crispFast, crispGuarded, dense, flexPrefill, type PresetName, presetByName, presets } from './presets.js';
