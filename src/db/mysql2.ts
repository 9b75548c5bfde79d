// mysql2, loaded at first use: ~75 ms of CPU to load, and only a service with a MySQL pool (or a MySQL
// listener that gets a client) needs it. It is CommonJS, so a synchronous require keeps its callers synchronous.
import { createRequire } from 'node:module';
import type mysql from 'mysql2';

type Mysql2 = typeof mysql;
let loaded: Mysql2 | null = null;

export function mysql2(): Mysql2 {
  loaded ??= createRequire(import.meta.url)('mysql2') as Mysql2;
  return loaded;
}
