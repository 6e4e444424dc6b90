#!/bin/sh
# The failover test runs PostgreSQL the way sites that need it highly available do: Debian's patroni, etcd-server,
# haproxy and postgresql-15. Installed here, on first use, so `pnpm test` works on a fresh machine (CI's .ci/run).
set -e
if [ -x /usr/bin/patroni ] && [ -x /usr/bin/etcd ] && [ -x /usr/sbin/haproxy ] && [ -x /usr/lib/postgresql/15/bin/postgres ]; then
  exit 0
fi
echo "patroni, etcd-server, haproxy or postgresql-15 is missing: installing Debian's packages for the failover test"
if [ "$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
  echo "cannot install them: not root and no sudo; install them with: apt-get install patroni etcd-server haproxy postgresql-15" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq patroni etcd-server haproxy postgresql-15 >/dev/null
/usr/bin/patroni --version
