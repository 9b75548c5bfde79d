// Parsing an upstream's rate-limit headers: retry-after, x-ratelimit-* (and -requests/-tokens), Anthropic's
// anthropic-ratelimit-*, the IETF ratelimit drafts, and the lock release `rate` object that wins over them.
import t from 'tap';
import { applyRateObject, emptyRateInfo, hasRateInfo, parseRateHeaders, parseReset, parseRetryAfter, type Headers } from '../src/governor/rate-headers.js';

const NOW = Date.UTC(2026, 10, 22, 12, 0, 0); // wall clock for dates in headers
const parse = (h: Headers) => ({ ...parseRateHeaders(h, NOW, emptyRateInfo()) });

t.test('retry-after: delay seconds or an HTTP date, never negative', async (t) => {
  t.equal(parseRetryAfter('120', NOW), 120_000);
  t.equal(parseRetryAfter(' 1.5 ', NOW), 1500);
  t.equal(parseRetryAfter('Sun, 22 Nov 2026 12:00:30 GMT', NOW), 30_000);
  t.equal(parseRetryAfter('Sun, 22 Nov 2026 11:59:00 GMT', NOW), 0, 'a date in the past means now');
  t.ok(Number.isNaN(parseRetryAfter('soon', NOW)), 'garbage is "not said"');
  t.ok(Number.isNaN(parseRetryAfter(undefined, NOW)));
  t.equal(parseRetryAfter(['7', '9'], NOW), 7000, 'a repeated header: the first value');
});

t.test('reset: delta seconds, epoch seconds or ms, Go durations, RFC 3339 dates', async (t) => {
  t.equal(parseReset('30', NOW), 30_000);
  t.equal(parseReset(String(NOW / 1000 + 45), NOW), 45_000, 'epoch seconds (GitHub style)');
  t.equal(parseReset(String(NOW + 2500), NOW), 2500, 'epoch ms');
  t.equal(parseReset('6m0s', NOW), 360_000, 'OpenAI duration');
  t.equal(parseReset('1h2m3.5s', NOW), 3_723_500);
  t.equal(parseReset('20ms', NOW), 20);
  t.equal(parseReset('1s', NOW), 1000);
  t.equal(parseReset('2026-11-22T12:00:10Z', NOW), 10_000, 'Anthropic RFC 3339');
  t.ok(Number.isNaN(parseReset('later', NOW)));
});

t.test('x-ratelimit-*: plain, and -requests winning over plain; -tokens recorded apart', async (t) => {
  t.match(parse({ 'x-ratelimit-limit': '600', 'x-ratelimit-remaining': '599', 'x-ratelimit-reset': '60' }), {
    limit: 600,
    remaining: 599,
    resetMs: 60_000,
  });
  const openai = parse({
    'x-ratelimit-limit-requests': '5000',
    'x-ratelimit-remaining-requests': '4999',
    'x-ratelimit-reset-requests': '12ms',
    'x-ratelimit-limit-tokens': '160000',
    'x-ratelimit-remaining-tokens': '159000',
    'x-ratelimit-reset-tokens': '6m0s',
    'x-ratelimit-limit': '1',
  });
  t.match(openai, { limit: 5000, remaining: 4999, resetMs: 12, tokenLimit: 160_000 });
  t.ok(Number.isNaN(openai.windowMs), 'no window stated: the learner takes it per minute');
  t.ok(Number.isNaN(openai.retryAfterMs));
});

t.test('header names match case-insensitively (a lock client may send them as received)', async (t) => {
  t.match(parse({ 'X-RateLimit-Limit': '100', 'Retry-After': '3', RateLimit: 'limit=5, remaining=1, reset=2' }), {
    limit: 100,
    remaining: 1,
    retryAfterMs: 3000,
  });
});

t.test('anthropic-ratelimit-*: requests limit, remaining and an RFC 3339 reset', async (t) => {
  t.match(
    parse({
      'anthropic-ratelimit-requests-limit': '50',
      'anthropic-ratelimit-requests-remaining': '0',
      'anthropic-ratelimit-requests-reset': '2026-11-22T12:00:20Z',
      'anthropic-ratelimit-tokens-limit': '40000',
      'retry-after': '20',
    }),
    { limit: 50, remaining: 0, resetMs: 20_000, tokenLimit: 40_000, retryAfterMs: 20_000 },
  );
});

t.test('IETF draft: ratelimit dictionary, structured-field list, policy with a window', async (t) => {
  t.match(parse({ ratelimit: 'limit=100, remaining=50, reset=30' }), { limit: 100, remaining: 50, resetMs: 30_000 });
  t.match(parse({ ratelimit: '"default";r=50;t=30' }), { remaining: 50, resetMs: 30_000 });
  t.match(parse({ ratelimit: '"burst";r=8;t=1, "daily";r=3;t=600' }), { remaining: 3, resetMs: 600_000 }, 'the policy with the fewest left');
  t.match(parse({ 'ratelimit-policy': '100;w=60' }), { limit: 100, windowMs: 60_000 });
  t.match(parse({ 'ratelimit-policy': '"default";q=100;w=10' }), { limit: 100, windowMs: 10_000 }, 'draft 07+ form');
  t.match(
    parse({ 'ratelimit-policy': '10;w=1, 100;w=60', ratelimit: 'limit=10, remaining=9, reset=1' }),
    { limit: 100, remaining: 9, windowMs: 60_000 },
    'several policies: the lowest per-minute quota (100/min, not the 10/s burst) is the limit',
  );
  t.match(
    parse({ 'ratelimit-limit': '100, 100;w=60', 'ratelimit-remaining': '7', 'ratelimit-reset': '12' }),
    { limit: 100, remaining: 7, resetMs: 12_000, windowMs: 60_000 },
    'draft 02 separate headers',
  );
  t.match(
    parse({ 'ratelimit-policy': '"default";q=100;w=10', 'x-ratelimit-limit-requests': '500' }),
    { limit: 500 },
    'vendor headers are the more specific statement',
  );
  t.ok(Number.isNaN(parse({ 'ratelimit-policy': '"default";q=100;w=10', 'x-ratelimit-limit-requests': '500' }).windowMs));
});

t.test('unrelated or malformed headers say nothing', async (t) => {
  const none = parse({ 'content-type': 'application/json', 'x-request-id': 'abc', age: '3', 'x-ratelimit-limit': 'lots', ratelimit: 'nope' });
  t.notOk(hasRateInfo(parseRateHeaders({ 'content-type': 'text/plain' }, NOW, emptyRateInfo())));
  t.ok(Number.isNaN(none.limit));
  t.ok(Number.isNaN(none.remaining));
});

t.test('the lock release rate object wins over headers, field by field', async (t) => {
  const info = parseRateHeaders({ 'x-ratelimit-limit': '600', 'x-ratelimit-remaining': '10', 'ratelimit-policy': '100;w=10' }, NOW, emptyRateInfo());
  applyRateObject({ limit: 120, resetMs: 4000, tokenLimit: 9000 }, info);
  t.match(info, { limit: 120, remaining: 10, resetMs: 4000, tokenLimit: 9000 });
  t.ok(Number.isNaN(info.windowMs), 'a rate limit is per minute');
  applyRateObject({ limit: -1, remaining: Number.NaN } as never, info);
  t.match(info, { limit: 120, remaining: 10 }, 'negative or non-numbers are ignored');
});
