# syntax=docker/dockerfile:1
# Hangar's control plane: the console built in, the server compiled (server/dist), PostgreSQL outside the image
# (DATABASE_URL; compose.yaml runs one beside it), running as the unprivileged `node` user.
#   docker build -t hangar . && docker run -e DATABASE_URL=postgresql://… -p 4000:4000 -v hangar-data:/data hangar
# test/images.test.ts runs this file's build commands and lays out its final stage on the host, since CI has no
# Docker daemon: change the two together.

ARG NODE_IMAGE=node:20.19-bookworm-slim

FROM ${NODE_IMAGE} AS build
WORKDIR /src
RUN npm install -g pnpm@10.34.0
# The manifests first: the install layer is reused until a dependency changes.
COPY package.json pnpm-lock.yaml pnpm-workspace.yaml .npmrc ./
COPY server/package.json server/package.json
COPY web/package.json web/package.json
COPY e2e/package.json e2e/package.json
COPY packages/common/package.json packages/common/package.json
COPY packages/agent/package.json packages/agent/package.json
RUN pnpm install --frozen-lockfile
COPY . .
RUN pnpm build
# Only what the server needs at run time; pnpm keeps the store at the root, the server's links point into it.
RUN rm -rf node_modules server/node_modules web/node_modules e2e/node_modules packages/*/node_modules \
  && pnpm install --frozen-lockfile --prod --filter @hangar/server

FROM ${NODE_IMAGE} AS server
ENV NODE_ENV=production HOST=0.0.0.0 PORT=4000 HANGAR_DATA_DIR=/data
WORKDIR /app
COPY --from=build /src/node_modules ./node_modules
COPY --from=build /src/server/node_modules ./server/node_modules
COPY --from=build /src/server/package.json ./server/package.json
COPY --from=build /src/server/bin ./server/bin
COPY --from=build /src/server/dist ./server/dist
COPY --from=build /src/server/scripts/server-stamp.mjs ./server/scripts/server-stamp.mjs
COPY --from=build /src/web/scripts/console-stamp.mjs ./web/scripts/console-stamp.mjs
# Read beside the bundle as beside the sources (scripts/build.mjs: paths from import.meta.url).
COPY --from=build /src/packages/common/src/download/sha256-worker.cjs ./packages/common/src/download/sha256-worker.cjs
COPY --from=build /src/prisma/migrations ./prisma/migrations
COPY --from=build /src/web/dist ./web/dist
RUN mkdir -p /data && chown node:node /data
USER node
VOLUME /data
EXPOSE 4000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s \
  CMD node -e "fetch('http://127.0.0.1:'+(process.env.PORT||4000)+'/readyz').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"
ENTRYPOINT ["node", "server/bin/hangar.mjs"]
CMD ["server"]
