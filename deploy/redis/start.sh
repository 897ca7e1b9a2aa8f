#!/bin/sh
# Starts redis-server on redis.conf (and any further arguments) with the ACL users of
# users.acl beside it: the default user is off, and the services' user, relayrl, logs in with
# the password in $RELAYRL_REDIS_PASSWORD (the variable auth.redis_password_env names), which
# this writes into a copy of the ACL file readable by this user only.
set -eu
: "${RELAYRL_REDIS_PASSWORD:?set RELAYRL_REDIS_PASSWORD (the services Redis password)}"
here=$(dirname "$0")
acl=${RELAYRL_REDIS_ACL:-/tmp/users.acl}
umask 077
awk '$1 == "user" && $2 == "relayrl" { $0 = $0 " >" ENVIRON["RELAYRL_REDIS_PASSWORD"] } { print }' \
    "$here/users.acl" > "$acl"
exec redis-server "$here/redis.conf" --aclfile "$acl" "$@"
