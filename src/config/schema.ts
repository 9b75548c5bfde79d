// The configuration table: one schema that yields the TypeScript type, boot-time validation,
// the env names and docs/configuration.md. Every key can be set in the file or by its env name.
import { Type, type Static, type TSchema } from '@sinclair/typebox';

const port = (env: string, def: number, description: string) =>
  Type.Integer({ minimum: 0, maximum: 65535, default: def, env, description });

export const ConfigSchema = Type.Object(
  {
    host: Type.String({ minLength: 1, default: '127.0.0.1', env: 'POOLGATE_HOST', description: 'Bind address of every listener.' }),
    controlPort: port('POOLGATE_CONTROL_PORT', 7070, 'Control API port (0 picks a free one).'),
    proxyPort: port('POOLGATE_PROXY_PORT', 7071, 'Pool traffic (data plane) port.'),
    lockPort: port('POOLGATE_LOCK_PORT', 7072, 'Lock API port.'),
    metricsPort: port('POOLGATE_METRICS_PORT', 9465, 'Prometheus /metrics port.'),
    pgPort: port('POOLGATE_PG_PORT', 15432, 'PostgreSQL wire listener port.'),
    mysqlPort: port('POOLGATE_MYSQL_PORT', 13306, 'MySQL wire listener port.'),
    mysqlServerVersion: Type.String({
      minLength: 1,
      maxLength: 100,
      pattern: '^[\\x20-\\x7e]+$',
      default: 'auto',
      env: 'POOLGATE_MYSQL_SERVER_VERSION',
      description:
        "Server version the MySQL listener's greeting announces (it goes out before the client names its pool). 'auto': learned from the servers of the MySQL pools (e.g. `5.5.5-10.11.6-MariaDB`; the oldest version when they differ; `8.0.36-poolgate` before any is learned or when the pools' servers are of different engines). Any other text is announced as is. Either way session tracking and MariaDB's extended column metadata are offered only when every pool's server offers them.",
    }),
    wireTlsCertFile: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'POOLGATE_WIRE_TLS_CERT_FILE',
      description: 'PEM certificate (chain) the PostgreSQL and MySQL wire listeners present to clients that ask for TLS; null: those listeners refuse TLS.',
    }),
    wireTlsKeyFile: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'POOLGATE_WIRE_TLS_KEY_FILE',
      description: 'PEM private key of wireTlsCertFile.',
    }),
    wireMaxPreparedStatements: Type.Integer({
      minimum: 1,
      maximum: 100_000,
      default: 200,
      env: 'POOLGATE_WIRE_MAX_PREPARED_STATEMENTS',
      description:
        'Most named prepared statements the PostgreSQL listener keeps on one server connection in transaction mode; past it the least recently used is closed (and prepared again when a client needs it).',
    }),
    poolDomain: Type.String({
      minLength: 1,
      pattern: '^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$',
      default: 'pools.localhost',
      env: 'POOLGATE_POOL_DOMAIN',
      description: 'Pool hostnames are <subdomain>.<poolDomain>.',
    }),
    baseUrl: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'POOLGATE_BASE_URL',
      description: 'Public address of the Control API ({base_url}); derived from host and port when null.',
    }),
    lockApiUrl: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'POOLGATE_LOCK_API_URL',
      description: 'Public address of the lock API ({lock_api_url}); derived from host and port when null.',
    }),
    dashboardUrl: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'POOLGATE_DASHBOARD_URL',
      description: 'Public address of the dashboard (auth handoffs\' dashboard_url, sign-in links); <baseUrl>/dashboard when null.',
    }),
    dataDir: Type.String({ minLength: 1, default: './data', env: 'POOLGATE_DATA_DIR', description: 'Embedded store, generated master key and admin socket.' }),
    embeddedSharedBuffersMb: Type.Integer({
      minimum: 1,
      maximum: 4096,
      default: 32,
      env: 'POOLGATE_EMBEDDED_SHARED_BUFFERS_MB',
      description:
        "shared_buffers of the embedded PGlite store, in MB. Its WebAssembly memory never shrinks, so this bounds the store's share of the resident set (PostgreSQL's 128 MB default made an idle embedded service ~410 MB).",
    }),
    databaseUrl: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'DATABASE_URL',
      description: 'PostgreSQL store; null uses the embedded PGlite store in dataDir.',
    }),
    redisUrl: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'REDIS_URL',
      description:
        "Redis for the shared governor, the lock API's leases and the HMAC nonces: redis:// or rediss:// for one server, or redis+sentinel://[:password@]host:port[,host:port…]/<master name>[/<db>] for a primary watched by Sentinel; null (with redisSentinels and redisClusterNodes unset) uses the in-memory governor. See docs/high-availability.md.",
    }),
    redisSentinels: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'REDIS_SENTINELS',
      description: 'Redis Sentinel instead of redisUrl: the sentinels as host:port,host:port… (any of them answers where the primary is); needs redisSentinelMaster.',
    }),
    redisSentinelMaster: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'REDIS_SENTINEL_MASTER',
      description: 'The name the sentinels of redisSentinels monitor the primary by (`sentinel monitor <name> …`).',
    }),
    redisClusterNodes: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'REDIS_CLUSTER_NODES',
      description:
        'Redis Cluster instead of redisUrl: seed nodes as host:port,host:port… (the rest of the cluster is discovered). Every script keeps to one hash slot; wake-ups use sharded pub/sub (Redis 7).',
    }),
    redisPassword: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'REDIS_PASSWORD',
      description: 'Password of the Redis data nodes for redisSentinels and redisClusterNodes (and a redis+sentinel:// URL without one).',
    }),
    redisTls: Type.Boolean({
      default: false,
      env: 'REDIS_TLS',
      description: 'TLS to the Redis nodes (and sentinels) of redisSentinels and redisClusterNodes; a URL says it by its scheme (rediss://, rediss+sentinel://).',
    }),
    governorFailurePolicy: Type.Union([Type.Literal('closed'), Type.Literal('open')], {
      default: 'closed',
      env: 'POOLGATE_GOVERNOR_FAILURE_POLICY',
      description: "When Redis cannot be reached: 'closed' refuses pool traffic with 503 governor_unavailable; 'open' admits against a local per-node limit (max_concurrent / governorFailOpenDivisor).",
    }),
    governorFailOpenDivisor: Type.Integer({
      minimum: 1,
      maximum: 1000,
      default: 1,
      env: 'POOLGATE_GOVERNOR_FAIL_OPEN_DIVISOR',
      description: "With the 'open' policy each node admits max(1, floor(max_concurrent / this)) per pool while Redis is down; set it to the number of data plane nodes to keep the origin near its limit.",
    }),
    governorLeaseTermMs: Type.Integer({
      minimum: 1000,
      maximum: 600000,
      default: 30000,
      env: 'POOLGATE_GOVERNOR_LEASE_TERM_MS',
      description: 'Redis governor slot lease term: a node that dies without releasing loses its slots after this long; live nodes refresh theirs every third of it.',
    }),
    secretKey: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'POOLGATE_SECRET_KEY',
      description: 'Master key (32 bytes, hex or base64) encrypting secrets at rest; null generates one into dataDir (mode 0600).',
    }),
    allowPrivateTargets: Type.Boolean({
      default: false,
      env: 'POOLGATE_ALLOW_PRIVATE_TARGETS',
      description: 'Allow loopback/private/link-local origins, database hosts and webhook URLs (local use and tests).',
    }),
    controlBodyLimit: Type.Integer({
      minimum: 1024,
      maximum: 16 * 1024 * 1024,
      default: 65536,
      env: 'POOLGATE_CONTROL_BODY_LIMIT',
      description: 'Largest Control API request body in bytes; larger bodies get 413.',
    }),
    metricsRetentionDays: Type.Integer({
      minimum: 1,
      maximum: 3650,
      default: 30,
      env: 'POOLGATE_METRICS_RETENTION_DAYS',
      description: 'How long per-minute pool metrics are kept; the metrics range is clamped to it.',
    }),
    maxWebhookDestinations: Type.Integer({
      minimum: 1,
      maximum: 10000,
      default: 25,
      env: 'POOLGATE_MAX_WEBHOOK_DESTINATIONS',
      description: 'Webhook destinations one team may have (the spec\'s cap).',
    }),
    intakeTtlSeconds: Type.Integer({
      minimum: 60,
      maximum: 86400,
      default: 900,
      env: 'POOLGATE_INTAKE_TTL_SECONDS',
      description: 'Lifetime of a one-shot credential intake minted by auth-handoff.',
    }),
    originCaFile: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'POOLGATE_ORIGIN_CA_FILE',
      description: 'Extra CA certificates (PEM file) trusted for https origins, besides the system roots.',
    }),
    webhookCaFile: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'POOLGATE_WEBHOOK_CA_FILE',
      description: 'Extra CA certificates (PEM file) trusted for webhook receivers, besides the system roots.',
    }),
    webhookConcurrency: Type.Integer({
      minimum: 1,
      maximum: 4096,
      default: 256,
      env: 'POOLGATE_WEBHOOK_CONCURRENCY',
      description: 'Webhook deliveries in flight at once per worker process, all destinations together.',
    }),
    webhookDestinationConcurrency: Type.Integer({
      minimum: 1,
      maximum: 1024,
      default: 64,
      env: 'POOLGATE_WEBHOOK_DESTINATION_CONCURRENCY',
      description:
        'Ceiling of one destination\'s adaptive in-flight limit per worker process: the limit starts at 8 (or this, if lower), grows while the receiver answers fast and backs off on errors and slow answers (docs/jobs-and-webhooks.md).',
    }),
    webhookReplayRetentionHours: Type.Integer({
      minimum: 1,
      maximum: 24 * 365,
      default: 720,
      env: 'POOLGATE_WEBHOOK_REPLAY_RETENTION_HOURS',
      description: 'How long a finished (delivered or given-up) delivery keeps its body for replay and recover, then is pruned; the attempt history is kept.',
    }),
    webhookRetryBaseMs: Type.Integer({
      minimum: 10,
      maximum: 3_600_000,
      default: 10_000,
      env: 'POOLGATE_WEBHOOK_RETRY_BASE_MS',
      description: 'Ceiling of the random wait after a failed delivery; it doubles with each further failure (full jitter).',
    }),
    webhookRetryCapMs: Type.Integer({
      minimum: 10,
      maximum: 86_400_000,
      default: 3_600_000,
      env: 'POOLGATE_WEBHOOK_RETRY_CAP_MS',
      description: 'Largest ceiling of the wait between delivery attempts.',
    }),
    webhookMaxAttempts: Type.Integer({
      minimum: 1,
      maximum: 1000,
      default: 15,
      env: 'POOLGATE_WEBHOOK_MAX_ATTEMPTS',
      description: 'Attempts after which one delivery is given up (its attempts stay in the history).',
    }),
    webhookClaimLeaseMs: Type.Integer({
      minimum: 6000,
      maximum: 3_600_000,
      default: 30_000,
      env: 'POOLGATE_WEBHOOK_CLAIM_LEASE_MS',
      description: 'How long a claimed delivery stays claimed; after a worker crash it is sent again once this passes.',
    }),
    proxyHttpParser: Type.Union([Type.Literal('auto'), Type.Literal('node'), Type.Literal('uws')], {
      default: 'auto',
      env: 'POOLGATE_PROXY_HTTP_PARSER',
      description:
        "The proxy port's HTTP/1.1 server. 'node' (node:http's llhttp, the default): answers pipelined, HTTP/1.0 and malformed requests as RFC 9112 asks and authenticates before 100 Continue; several data plane threads share one port through SO_REUSEPORT. 'uws' (uWebSockets.js 20.30): only where its native build loads (Node 20 on linux; start-up is refused otherwise), closes pipelined requests unanswered and does not answer HTTP/1.0 or malformed ones, so only behind a strict HTTP proxy. 'auto' is 'node'. See docs/http-front-door.md.",
    }),
    proxyBodyLimit: Type.Integer({
      minimum: 0,
      maximum: Number.MAX_SAFE_INTEGER,
      default: 1024 * 1024 * 1024,
      env: 'POOLGATE_PROXY_BODY_LIMIT',
      description: 'Largest request body in bytes the data plane forwards to an origin; larger bodies get 413. 0 means no limit.',
    }),
    proxyBodyTimeoutMs: Type.Integer({
      minimum: 0,
      maximum: 3_600_000,
      default: 10_000,
      env: 'POOLGATE_PROXY_BODY_TIMEOUT_MS',
      description:
        'How long the data plane waits for the next byte of a request body before it answers 408 and closes the connection (like nginx client_body_timeout). The first 64 KiB of a body are read before the request takes a slot; 0 turns the timeout off.',
    }),
    accessLogFile: Type.Union([Type.String({ minLength: 1 }), Type.Null()], {
      default: null,
      env: 'POOLGATE_ACCESS_LOG_FILE',
      description: 'Data plane access log (JSON lines); null writes it to stderr.',
    }),
    accessLogSample: Type.Integer({
      minimum: 0,
      maximum: 1_000_000,
      default: 1,
      env: 'POOLGATE_ACCESS_LOG_SAMPLE',
      description: 'Log one in N successful pool requests (1 logs every one, 0 none of them); refusals and errors are always logged.',
    }),
    dataplaneThreads: Type.Integer({
      minimum: 0,
      maximum: 32,
      default: 1,
      env: 'POOLGATE_DATAPLANE_THREADS',
      description:
        'Threads serving pool traffic (0: one per CPU). Above 1 the pool listener runs in worker threads sharing the limits through shared memory (not with redisUrl); see docs/http-data-plane.md.',
    }),
    dataplaneThreadPorts: Type.Union([Type.Literal('shared'), Type.Literal('each')], {
      default: 'shared',
      env: 'POOLGATE_DATAPLANE_THREAD_PORTS',
      description:
        'With dataplaneThreads above 1: shared puts every thread on proxyPort (SO_REUSEPORT; with proxyPort 0, one free port for all) and the kernel spreads connections over them; each gives thread i the port proxyPort+i (a free port each when proxyPort is 0), for a balancer that picks the thread.',
    }),
    snapshotResyncMs: Type.Integer({
      minimum: 1000,
      maximum: 3_600_000,
      default: 30_000,
      env: 'POOLGATE_SNAPSHOT_RESYNC_MS',
      description: 'Period of the data plane\'s full config resync on PostgreSQL, besides the change feed (the embedded store cannot lose a notification: there it only retries a failed reload).',
    }),
    trustedProxies: Type.String({
      maxLength: 4096,
      default: '',
      env: 'POOLGATE_TRUSTED_PROXIES',
      description:
        'Comma-separated CIDRs of reverse proxies in front of the data plane and lock API. Only from these peers is X-Forwarded-For read (its rightmost untrusted entry is the client address for IP allowlists); empty trusts none.',
    }),
    sqlBodyLimit: Type.Integer({
      minimum: 1024,
      maximum: 64 * 1024 * 1024,
      default: 1024 * 1024,
      env: 'POOLGATE_SQL_BODY_LIMIT',
      description: 'Largest SQL-over-HTTP request body in bytes (query text and params); larger bodies get 413.',
    }),
    dbIdleTimeoutMs: Type.Integer({
      minimum: 100,
      maximum: 86_400_000,
      default: 60_000,
      env: 'POOLGATE_DB_IDLE_TIMEOUT_MS',
      description:
        "How long a database pool's server connection may sit unused before it is closed, in ms. One setting for every holder: SQL over HTTP and the PostgreSQL and MySQL listeners share one upstream pool per database pool, whose open connections never exceed its max_concurrent.",
    }),
    dbAllowInsecure: Type.Boolean({
      default: false,
      env: 'POOLGATE_DB_ALLOW_INSECURE',
      description: 'Connect to a database pool\'s server without TLS when it refuses TLS (db_sslmode is otherwise enforced). Local use and tests only.',
    }),
    logLevel: Type.Union(
      ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].map((l) => Type.Literal(l)),
      { default: 'info', env: 'POOLGATE_LOG_LEVEL', description: 'Log level of the service log (stderr).' },
    ),
    logFormat: Type.Union(
      ['auto', 'json', 'pretty'].map((l) => Type.Literal(l)),
      {
        default: 'auto',
        env: 'POOLGATE_LOG_FORMAT',
        description: 'Service log format on stderr: json (one JSON object a line), pretty (time, level, message, fields; for people), auto (pretty when stderr is a terminal, json otherwise). The access log stays JSON.',
      },
    ),
  },
  { additionalProperties: false },
);

export type Config = Readonly<Static<typeof ConfigSchema>>;

export interface ConfigEntry {
  key: keyof Config & string;
  env: string;
  schema: TSchema;
}

/** The table view of the schema: one row per key with its env name. */
export const configEntries: readonly ConfigEntry[] = Object.entries(ConfigSchema.properties).map(([key, schema]) => ({
  key: key as keyof Config & string,
  env: (schema as unknown as { env: string }).env,
  schema: schema as TSchema,
}));
