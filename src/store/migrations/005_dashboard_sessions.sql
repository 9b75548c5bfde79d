-- Dashboard sign-in: server-side sessions behind the HttpOnly cookie, and one-time sign-in links minted by
-- `poolgate admin login-link`. Both keep only the SHA-256 of the secret the browser or the link holds.
CREATE TABLE dashboard_sessions (
  id            serial PRIMARY KEY,
  session_hash  text NOT NULL UNIQUE,
  team_id       integer NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  user_id       integer NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  -- The API token signed in with (its revocation or expiry ends the session); null for a sign-in link.
  token_id      integer REFERENCES api_tokens(id) ON DELETE CASCADE,
  abilities     text[] NOT NULL,
  expires_at    timestamptz NOT NULL,
  ended_at      timestamptz,
  created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dashboard_login_links (
  id          serial PRIMARY KEY,
  link_hash   text NOT NULL UNIQUE,
  team_id     integer NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  user_id     integer NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  expires_at  timestamptz NOT NULL,
  used_at     timestamptz,
  created_at  timestamptz NOT NULL DEFAULT now()
);
