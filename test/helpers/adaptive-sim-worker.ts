// The worker side of simulateApart (adaptive-sim.ts): runs one simulation and posts its result.
import { parentPort, workerData } from 'node:worker_threads';
import { simulate, type SimOptions } from './adaptive-sim.js';

parentPort!.postMessage(await simulate(workerData as SimOptions));
