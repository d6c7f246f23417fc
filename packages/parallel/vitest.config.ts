import { crispVitest } from '../../tooling/vitest.preset';

export default crispVitest;
