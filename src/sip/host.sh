#!/bin/sh
# host: the jump host's power tool, at /opt/sip/bin/host as Airship SIP's
# jump-host image expects it. `host list` names this cluster's hosts,
# `host reboot <host>` restarts one gracefully through its BMC (Redfish).
# Written by nodewarden from the SIPCluster; do not edit in place.
# The image provides jq and redfishtool.
set -eu

hosts=${SIP_HOSTS_FILE:-/etc/opt/sip/hosts}

usage() {
  echo "usage: host list             the hosts of this cluster"
  echo "       host reboot <host>    restart a host through its BMC"
}

need_tools() {
  for tool in jq redfishtool; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "host: '$tool' is missing; the jump host's image must provide jq and redfishtool" >&2
      exit 1
    fi
  done
}

field() {
  jq -r --arg host "$1" ".[] | select(.name == \$host) | .bmc.$2" "$hosts"
}

case "${1:-}" in
list)
  need_tools
  jq -r '.[].name' "$hosts"
  ;;
reboot)
  if [ -z "${2:-}" ]; then
    echo "host: which host? (host list names them)" >&2
    usage >&2
    exit 1
  fi
  need_tools
  address=$(field "$2" ip)
  user=$(field "$2" username)
  password=$(field "$2" password)
  if [ -z "$address" ] || [ -z "$user" ] || [ -z "$password" ]; then
    echo "host: no host '$2' with BMC access (host list names them)" >&2
    exit 1
  fi
  echo "Rebooting host '$2'"
  redfishtool -r "$address" -u "$user" -p "$password" Systems reset GracefulRestart
  ;;
*)
  usage
  ;;
esac
