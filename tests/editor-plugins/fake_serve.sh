#!/bin/sh
# Stands in for the spark-agent binary in the plugins' start-server tests: `fake_serve.sh serve
# --host H --port P` runs the scripted fake server there (token "secret").
exec node "$(dirname "$0")/fake_rpc_server.js" "$@"
