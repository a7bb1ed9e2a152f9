#!/bin/sh
# What the official redis image's entrypoint does: `redis-server …` started as root gets the data directory
# handed to the redis user and runs as that user (setpriv, from util-linux, instead of gosu); any other
# command runs as it is.
set -e
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
    set -- redis-server "$@"
fi
if [ "$1" = redis-server ] && [ "$(id -u)" = 0 ]; then
    find . \! -user redis -exec chown redis '{}' +
    exec setpriv --reuid=redis --regid=redis --init-groups "$0" "$@"
fi
if [ "$(umask)" = 0022 ]; then
    umask 0077
fi
exec "$@"
