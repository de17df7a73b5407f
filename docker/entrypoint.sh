#!/bin/sh
# The entrypoint of tandem's images: the first argument picks the program.
#
#   gateway  [FLAGS...]   tandem-gateway
#   verifier [FLAGS...]   tandem-verifier
#   drafter  [FLAGS...]   tandem-drafter
#   tandem   [ARGS...]    the CLI (also: cli)
#   help                  this text
#   anything else         run as given (e.g. sh)
#
# In a container the services listen on every interface: without a --config
# file, and unless the environment says otherwise, TANDEM_LISTEN and
# TANDEM_HEALTH_LISTEN are 0.0.0.0 on the role's default ports (gateway 7700,
# verifier 7710, drafter 7720; health one above, metrics two above), and
# --check-config shows them as coming from the environment. With --config the
# file says where to listen (the environment would outrank it).
set -eu

usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
}

role_defaults() {
  base=$1
  shift
  for a in "$@"; do
    case "$a" in --config|--config=*) return 0 ;; esac
  done
  export TANDEM_LISTEN="${TANDEM_LISTEN:-0.0.0.0:$base}"
  export TANDEM_HEALTH_LISTEN="${TANDEM_HEALTH_LISTEN:-0.0.0.0:$((base + 1))}"
}

cmd="${1:-help}"
[ $# -gt 0 ] && shift
case "$cmd" in
  gateway)  role_defaults 7700 "$@"; exec tandem-gateway "$@" ;;
  verifier) role_defaults 7710 "$@"; exec tandem-verifier "$@" ;;
  drafter)  role_defaults 7720 "$@"; exec tandem-drafter "$@" ;;
  tandem|cli) exec tandem "$@" ;;
  help|-h|--help) usage ;;
  *) exec "$cmd" "$@" ;;
esac
