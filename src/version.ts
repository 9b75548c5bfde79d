// The package's version, read from its package.json.
import { readFileSync } from 'node:fs';

export function version(): string {
  // The nearest package.json above this file is poolgate's: dist/src/version.js in a build, src/version.ts from source.
  for (let dir = new URL('.', import.meta.url); ; dir = new URL('..', dir)) {
    try {
      return (JSON.parse(readFileSync(new URL('package.json', dir), 'utf8')) as { version: string }).version;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || dir.pathname === '/') throw err;
    }
  }
}
