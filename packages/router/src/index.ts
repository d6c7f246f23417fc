/**
 * Routers that send each head to Vertical-Slash or pooled estimation: `cStruct` (CRISP), `jsd`
 * (FlexPrefill), `entropy`, `fixed`, `residualJsd` (does pooling explain the mass off the
 * anchors?) and `anyPe` (PE when any of several routers says so).
 *
 * @module @crisp/router
 */
export { type CStructOptions, type CStructRouter, cStruct } from './c-struct.js';
export { type JsdOptions, type JsdRouter, jsd, jsDistance } from './jsd.js';
export { type EntropyOptions, type EntropyRouter, entropy } from './entropy.js';
export { fixed } from './fixed.js';
export { routingAgreement } from './agreement.js';
export { type AnyPeRouter, anyPe } from './any-pe.js';
export { type ResidualJsdOptions, type ResidualJsdRouter, residualJsd } from './residual-jsd.js';
