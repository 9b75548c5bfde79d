-- Organisation, identity and the Control API's resources.

CREATE TABLE teams (
  id          serial PRIMARY KEY,
  name        text NOT NULL,
  slug        text NOT NULL UNIQUE,
  plan        text NOT NULL DEFAULT 'free' CHECK (plan IN ('free', 'pro', 'team', 'business')),
  created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
  id          serial PRIMARY KEY,
  team_id     integer NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  name        text NOT NULL,
  email       text NOT NULL,
  role        text NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
  created_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (team_id, email)
);

CREATE TABLE api_tokens (
  id          serial PRIMARY KEY,
  team_id     integer NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  user_id     integer NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  name        text NOT NULL,
  token_hash  text NOT NULL UNIQUE,
  last_four   text NOT NULL,
  abilities   text[] NOT NULL,
  expires_at  timestamptz NOT NULL,
  revoked_at  timestamptz,
  created_at  timestamptz NOT NULL DEFAULT now()
);

-- Stored credential records: origin credentials (bearer_static, api_key, basic), database roles
-- (postgres_role) and outbound webhook auth (bearer_static). The secret is AES-256-GCM ciphertext.
CREATE TABLE credentials (
  id          serial PRIMARY KEY,
  team_id     integer NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  name        text NOT NULL,
  method      text NOT NULL CHECK (method IN ('bearer_static', 'api_key', 'basic', 'postgres_role')),
  secret_enc  text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (team_id, name)
);

CREATE TABLE pools (
  id              serial PRIMARY KEY,
  team_id         integer NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  name            text NOT NULL,
  description     text,
  subdomain       text NOT NULL UNIQUE,
  backend         text NOT NULL CHECK (backend IN ('http', 'postgres', 'mysql')),
  origin          text,            -- https origin of an http pool
  origin_host     text,            -- lower-case host[:port] used for reuse
  db_host         text,
  db_port         integer,
  db_name         text,
  db_sslmode      text CHECK (db_sslmode IN ('verify-full', 'require')),
  max_concurrent  integer NOT NULL DEFAULT 10 CHECK (max_concurrent > 0),
  require_key     boolean NOT NULL DEFAULT true,
  auth_method     text CHECK (auth_method IN ('bearer_static', 'api_key', 'basic', 'postgres_role')),
  managed_auth    boolean NOT NULL DEFAULT false,
  credential_id   integer REFERENCES credentials(id) ON DELETE SET NULL,
  async_enabled   boolean NOT NULL DEFAULT false,
  async_on_queue  boolean NOT NULL DEFAULT false,
  settings        jsonb NOT NULL DEFAULT '{}'::jsonb,
  status          text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended', 'deleted')),
  created_at      timestamptz NOT NULL DEFAULT now(),
  updated_at      timestamptz NOT NULL DEFAULT now(),
  UNIQUE (team_id, name)
);
CREATE INDEX pools_team_origin ON pools (team_id, origin_host) WHERE backend = 'http';

CREATE TABLE budgets (
  id                     serial PRIMARY KEY,
  team_id                integer NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  name                   text NOT NULL,
  origin_max_concurrent  integer CHECK (origin_max_concurrent > 0),
  created_at             timestamptz NOT NULL DEFAULT now(),
  UNIQUE (team_id, name)
);

-- A pool belongs to at most one budget.
CREATE TABLE budget_pools (
  budget_id            integer NOT NULL REFERENCES budgets(id) ON DELETE CASCADE,
  pool_id              integer NOT NULL UNIQUE REFERENCES pools(id) ON DELETE CASCADE,
  reserved_concurrent  integer NOT NULL DEFAULT 0 CHECK (reserved_concurrent >= 0),
  PRIMARY KEY (budget_id, pool_id)
);

CREATE TABLE pool_keys (
  id                  serial PRIMARY KEY,
  pool_id             integer NOT NULL REFERENCES pools(id) ON DELETE CASCADE,
  label               text NOT NULL,
  key_hash            text NOT NULL UNIQUE,
  last_four           text NOT NULL,
  access              text NOT NULL DEFAULT 'write' CHECK (access IN ('read', 'write')),
  signing_secret_enc  text,
  expires_at          timestamptz,
  revoked_at          timestamptz,
  created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pool_keys_pool ON pool_keys (pool_id);

CREATE TABLE webhook_endpoints (
  id                    serial PRIMARY KEY,
  team_id               integer NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  name                  text NOT NULL,
  description           text,
  url                   text NOT NULL,
  disabled              boolean NOT NULL DEFAULT false,
  consecutive_failures  integer NOT NULL DEFAULT 0,
  signing_secret_enc    text NOT NULL,
  credential_id         integer REFERENCES credentials(id) ON DELETE SET NULL,
  auth_header           text,
  created_at            timestamptz NOT NULL DEFAULT now(),
  updated_at            timestamptz NOT NULL DEFAULT now(),
  UNIQUE (team_id, name)
);

CREATE TABLE pool_webhooks (
  pool_id              integer NOT NULL REFERENCES pools(id) ON DELETE CASCADE,
  webhook_endpoint_id  integer NOT NULL REFERENCES webhook_endpoints(id) ON DELETE CASCADE,
  PRIMARY KEY (pool_id, webhook_endpoint_id)
);

-- One-shot intake addresses minted by auth-handoff: the secret is posted once, then the row is spent.
CREATE TABLE credential_intakes (
  id               serial PRIMARY KEY,
  pool_id          integer NOT NULL REFERENCES pools(id) ON DELETE CASCADE,
  token_hash       text NOT NULL UNIQUE,
  auth_method      text NOT NULL,
  credential_name  text,
  expires_at       timestamptz NOT NULL,
  used_at          timestamptz,
  created_at       timestamptz NOT NULL DEFAULT now()
);

-- Per-pool per-minute rollups written in batches by the data plane; the metrics summary reads them.
CREATE TABLE pool_metrics_minute (
  pool_id    integer NOT NULL REFERENCES pools(id) ON DELETE CASCADE,
  minute     timestamptz NOT NULL,
  requests   bigint NOT NULL DEFAULT 0,
  admitted   bigint NOT NULL DEFAULT 0,
  queued     bigint NOT NULL DEFAULT 0,
  rejected   bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (pool_id, minute)
);

-- Every delivery attempt to a webhook destination (spec: "The history of a destination records …").
CREATE TABLE webhook_delivery_attempts (
  id                   bigserial PRIMARY KEY,
  webhook_endpoint_id  integer NOT NULL REFERENCES webhook_endpoints(id) ON DELETE CASCADE,
  job_id               text NOT NULL,
  pool_id              integer REFERENCES pools(id) ON DELETE SET NULL,
  attempted_at         timestamptz NOT NULL DEFAULT now(),
  result               text NOT NULL CHECK (result IN ('success', 'failure')),
  http_status          integer,
  error                text,
  attempt              integer NOT NULL,
  latency_ms           integer NOT NULL
);
CREATE INDEX webhook_delivery_attempts_endpoint ON webhook_delivery_attempts (webhook_endpoint_id, attempted_at DESC);
