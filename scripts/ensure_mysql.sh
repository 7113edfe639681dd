#!/usr/bin/env bash
# Print the URL of a MariaDB/MySQL for the outbox tests on stdout (only that; logs go to stderr),
# in this order:
#   1. $COGWORKER_TEST_MYSQL_URL, as given;
#   2. a server on 127.0.0.1:$COGWORKER_TEST_MYSQL_PORT (default 3306) that lets root in without a
#      password and may create databases (used as it is, never reconfigured);
#   3. Debian's MariaDB, started (and installed first if missing: mariadb-server) as the system
#      service, when we are root; it lets root in through its socket only, so a user the tests
#      use over TCP is made: 'cogworker'@'127.0.0.1', no password, rights on test_cogworker*.
# pytest-django creates test_<name>_gwN next to the name in the URL; the database itself need not exist.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { echo "ensure_mysql: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
how="set COGWORKER_TEST_MYSQL_URL (mysql://user:password@host:port/name) to a MariaDB 10.6+ or MySQL 8"

if [[ -n ${COGWORKER_TEST_MYSQL_URL:-} ]]; then
    echo "$COGWORKER_TEST_MYSQL_URL"
    exit 0
fi

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# can_use PORT USER: may USER (no password) create a database on 127.0.0.1:PORT? Bounded in time.
# It also makes the database the URL names, "cogworker": Django 6 connects to every database of the
# settings when it checks the models (MySQL's field checks ask the server's version), so a worker
# the tests start fails its checks while that database doesn't exist.
can_use() {
    local port=$1 user=$2
    local sql="CREATE DATABASE IF NOT EXISTS cogworker; CREATE DATABASE IF NOT EXISTS test_cogworker_probe; DROP DATABASE test_cogworker_probe"
    port_open "$port" || return 1
    if command -v mysql >/dev/null 2>&1; then
        mysql --connect-timeout=3 -h 127.0.0.1 -P "$port" -u "$user" -e "$sql" >/dev/null 2>&1
    elif [[ -x .venv/bin/python ]]; then
        .venv/bin/python - "$port" "$user" "$sql" >/dev/null 2>&1 <<'PY'
import sys
import pymysql
conn = pymysql.connect(host="127.0.0.1", port=int(sys.argv[1]), user=sys.argv[2], connect_timeout=3)
with conn.cursor() as cursor:
    for statement in sys.argv[3].split("; "):
        cursor.execute(statement)
PY
    else
        return 1
    fi
}

port=${COGWORKER_TEST_MYSQL_PORT:-3306}
for user in root cogworker; do
    if can_use "$port" "$user"; then
        log "using the MariaDB/MySQL on 127.0.0.1:$port (user $user)"
        echo "mysql://$user@127.0.0.1:$port/cogworker"
        exit 0
    fi
done
port_open "$port" && die "a server listens on 127.0.0.1:$port but lets neither root nor cogworker in without a password; $how"

# --- Debian's MariaDB, as the system service. ---
[[ $(id -u) -eq 0 ]] || die "no MariaDB/MySQL on 127.0.0.1:$port, and starting Debian's needs root; $how"
if ! command -v mariadbd >/dev/null 2>&1 && ! [[ -x /usr/sbin/mariadbd ]]; then
    command -v apt-get >/dev/null 2>&1 || die "no MariaDB/MySQL on 127.0.0.1:$port and apt-get is missing; $how"
    log "no MariaDB server; installing mariadb-server with apt-get"
    env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >&2
fi
log "starting Debian's MariaDB (service mariadb start)"
service mariadb start >&2 || die "service mariadb start failed; $how"
for _ in $(seq 50); do port_open "$port" && break; sleep 0.2; done
# (Root gets in through the socket only: a user of the tests' own, over TCP, without a password.)
mysql -u root -e "CREATE USER IF NOT EXISTS 'cogworker'@'127.0.0.1';
                  GRANT ALL ON \`test\\_cogworker%\`.* TO 'cogworker'@'127.0.0.1';
                  GRANT ALL ON \`cogworker\`.* TO 'cogworker'@'127.0.0.1'" >&2 \
    || die "could not make the tests' user in the MariaDB started; $how"
can_use "$port" cogworker || die "the MariaDB started doesn't let the tests' user create its databases; $how"
echo "mysql://cogworker@127.0.0.1:$port/cogworker"
