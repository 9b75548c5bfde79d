// Job ids: unguessable (256 random bits), so knowing one never helps to find another.
import { randomBytes } from 'node:crypto';

const JOB_ID = /^job_[A-Za-z0-9_-]{43}$/;

export const newJobId = (): string => `job_${randomBytes(32).toString('base64url')}`;

export const isJobId = (s: string): boolean => JOB_ID.test(s);
