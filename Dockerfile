# poolgate: every role in one process (`poolgate start`), embedded store in the /data volume.
# Build: docker build -t poolgate .   Run: docker run -p 7070-7072:7070-7072 -v poolgate-data:/data poolgate

FROM node:24-bookworm-slim AS build
# Toolchain only for native modules without a prebuilt binary for this architecture; not in the final image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
# npm ci runs the prepare script, which skips the build here (no sources yet); it is built below once they are copied.
COPY scripts/prepare.mjs ./scripts/prepare.mjs
# The image's own Node.js 24 runs poolgate: skip the node-linux-* packages that bring Node 24 to hosts whose system
# Node is older (their optional dependencies are only that).
RUN npm ci --omit=optional
COPY tsconfig.json ./
COPY bin ./bin
COPY config ./config
COPY src ./src
COPY dashboard ./dashboard
COPY scripts ./scripts
RUN npm run build && npm prune --omit=dev --omit=optional

FROM node:24-bookworm-slim
ENV NODE_ENV=production \
    POOLGATE_HOST=0.0.0.0 \
    POOLGATE_DATA_DIR=/data
WORKDIR /app
COPY --from=build /app/package.json ./package.json
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/bin ./bin
COPY --from=build /app/config ./config
COPY --from=build /app/dist ./dist
# Non-TS assets (SQL migrations, scripts) are read at run time from src/; it is small, so ship it whole.
COPY --from=build /app/src ./src
RUN mkdir -p /data && chown node:node /data
USER node
VOLUME ["/data"]
# control, proxy (pool traffic), lock API, metrics, PostgreSQL wire, MySQL wire (config/default.json)
EXPOSE 7070 7071 7072 9465 15432 13306
# Readiness of every role this process runs (store, snapshot, governor, listeners): docs/operations.md.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:' + (process.env.POOLGATE_METRICS_PORT || 9465) + '/readyz').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# SIGTERM (docker stop) drains in-flight work, then closes the store.
STOPSIGNAL SIGTERM
CMD ["node", "--max-semi-space-size=32", "--liftoff-only", "bin/poolgate.js", "start"]
