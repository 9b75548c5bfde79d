// Polls a condition (sync or async) every 10 ms until it holds or `ms` pass; resolves with its last value.
export async function until(cond: () => boolean | Promise<boolean>, ms = 5000): Promise<boolean> {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    if (await cond()) return true;
    await new Promise((r) => setTimeout(r, 10));
  }
  return cond();
}
