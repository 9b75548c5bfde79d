// Starts a TypeScript worker thread under tsx: tap's --import=tsx hooks do not reach worker threads on Node 20.
import { workerData } from 'node:worker_threads';
import { register } from 'tsx/esm/api';

register();
await import(workerData.script);
