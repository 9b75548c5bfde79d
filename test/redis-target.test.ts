// Issue 27 item 1: Redis is configured in the forms users know, one server (redis://), Sentinel (a
// redis+sentinel:// URL, or redisSentinels with redisSentinelMaster) or Cluster (redisClusterNodes), and a
// mistake stops the node at start with an error that names the setting.
import t from 'tap';
import { loadConfig } from '../src/config/load.js';
import { redisTarget } from '../src/config/redis-target.js';

const load = (env: Record<string, string>) => loadConfig({ env });

t.test('the forms', async (t) => {
  t.same(redisTarget(load({ REDIS_URL: 'redis://127.0.0.1:6379/2' })), { kind: 'single', url: 'redis://127.0.0.1:6379/2' });
  t.match(redisTarget(load({ REDIS_URL: 'redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26380/mymaster/3?sentinelPassword=x' })), {
    kind: 'sentinel',
    sentinels: [{ host: '10.0.0.1', port: 26379 }, { host: '10.0.0.2', port: 26380 }],
    name: 'mymaster',
    password: 's3cret',
    sentinelPassword: 'x',
    db: 3,
    tls: false,
  });
  t.match(redisTarget(load({ REDIS_SENTINELS: 'a.example:26379, [::1]:26380', REDIS_SENTINEL_MASTER: 'm', REDIS_PASSWORD: 'p', REDIS_TLS: 'true' })), {
    kind: 'sentinel',
    sentinels: [{ host: 'a.example', port: 26379 }, { host: '::1', port: 26380 }],
    name: 'm',
    password: 'p',
    tls: true,
  });
  t.match(redisTarget(load({ REDIS_CLUSTER_NODES: 'r1:7000,r2:7001' })), { kind: 'cluster', nodes: [{ host: 'r1', port: 7000 }, { host: 'r2', port: 7001 }] });
  t.equal(redisTarget(load({})), null, 'no Redis: the in-memory governor');
});

t.test('mistakes stop the start with the setting named', async (t) => {
  const bad: [Record<string, string>, RegExp][] = [
    [{ REDIS_URL: 'redis://a:1', REDIS_CLUSTER_NODES: 'b:2' }, /set one of redisUrl, redisSentinels and redisClusterNodes, not redisUrl and redisClusterNodes/],
    [{ REDIS_SENTINELS: 'a:26379' }, /redisSentinels needs redisSentinelMaster/],
    [{ REDIS_SENTINEL_MASTER: 'm' }, /redisSentinelMaster is set without redisSentinels/],
    [{ REDIS_CLUSTER_NODES: 'r1:7000,r2' }, /redisClusterNodes: "r2" is not host:port/],
    [{ REDIS_CLUSTER_NODES: 'r1:70000' }, /redisClusterNodes: "r1:70000" is not host:port/],
    [{ REDIS_URL: 'redis+sentinel://a:1' }, /redisUrl: .* is not redis\+sentinel:\/\/.*<master name>/],
    [{ REDIS_URL: 'redis+sentinel://:pw@a:1/m?bogus=1' }, /unknown parameter "bogus"/],
    [{ REDIS_URL: 'http://a:1' }, /redisUrl: "http:\/\/a:1" is not redis:\/\/, rediss:\/\/ or redis\+sentinel:\/\//],
  ];
  for (const [env, re] of bad) t.throws(() => load(env), { name: 'ConfigError', message: re }, JSON.stringify(env));
  t.throws(() => load({ REDIS_URL: 'redis+sentinel://:hunter2@a:1' }), { message: /\*\*\*@/ }, 'a password in a bad URL is not echoed');
  try {
    load({ REDIS_URL: 'redis+sentinel://:hunter2@a:1' });
  } catch (err) {
    t.notMatch((err as Error).message, /hunter2/);
  }
});
