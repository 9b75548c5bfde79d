// The async check as a stage (spec rule 5): a request that asks to become a job (X-Service-Async) on an
// async pool is refused with 413 before a slot when its declared body is larger than a job holds. In a
// chain only where the data plane spills jobs.
import type { Exchange, Stage } from '../pool-request/exchange.js';
import { asyncEligible, asyncRequested, JOB_TOO_LARGE, tooLargeForJob } from './job-intake.js';

export const asyncSizeStage: Stage = (ex: Exchange) =>
  asyncEligible(ex.pool!) && asyncRequested(ex.headers) && tooLargeForJob(ex.headers) ? JOB_TOO_LARGE : null;
