import { crispVitest } from '../vitest.preset';

export default crispVitest;
