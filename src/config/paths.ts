// Locates files shipped with the package (config/, migrations) from both src/ (tsx) and dist/src/.
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

function findRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    const up = dirname(dir);
    if (up === dir) throw new Error('poolgate: package root not found');
    dir = up;
  }
}

export const packageRoot = findRoot();
export const fromRoot = (...parts: string[]): string => join(packageRoot, ...parts);
