#!/usr/bin/env bash
# Stand-ins for the two base images that Dockerfile and docker-compose.yml name,
# python:3.11-slim-bookworm and redis:7-bookworm, built from Debian's packages, for machines
# that reach Debian's mirror and PyPI but no image registry. Talks to the daemon of DOCKER_HOST
# (tests/compose_support.py starts a private one) and builds only the images that are missing,
# so a second run costs nothing. Needs root (debootstrap), docker and debootstrap.
#
# Each stand-in carries this machine's CA bundle and the registry part of its pip settings, so
# `pip install` inside `docker-compose build` reaches PyPI the way pip on this machine does.
# They stay in the local daemon: never push them.
#
#   .ci/docker-standins.sh           build what is missing
#   .ci/docker-standins.sh --force   rebuild all three
set -euo pipefail

ROOTFS=pending-actions-standin/debian:bookworm
PYTHON=python:3.11-slim-bookworm
REDIS=redis:7-bookworm
LABEL=org.pending-actions.standin=1

force=${1:-}
export DOCKER_BUILDKIT=0  # the classic builder: no buildx plugin needed
have() { [ "$force" != --force ] && docker image inspect "$1" >/dev/null 2>&1; }

# the Debian mirror apt uses here (deb822 or one-line sources); MIRROR overrides
mirror() {
    if [ -n "${MIRROR:-}" ]; then echo "$MIRROR"; return; fi
    apt-cache policy 2>/dev/null | awk '$3 == "bookworm/main" && $2 ~ /^https?:/ {print $2; exit}' \
        | grep . || echo http://deb.debian.org/debian
}

work=$(mktemp -d /var/tmp/pa-standins.XXXXXX)
trap 'rm -rf "$work"' EXIT

if ! have "$ROOTFS"; then
    url=$(mirror)
    echo "debootstrap bookworm from $url" >&2
    debootstrap --variant=minbase bookworm "$work/rootfs" "$url" >"$work/debootstrap.log" 2>&1 \
        || { tail -30 "$work/debootstrap.log" >&2; exit 1; }
    rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
    tar -C "$work/rootfs" -c . | docker import --change "LABEL $LABEL" - "$ROOTFS" >/dev/null
    rm -rf "$work/rootfs"
fi

# The build context of both derived images: the CA bundle pip uses here, and a pip.conf with
# the index settings of this machine (local paths and file:// indexes dropped: not in the image).
mkdir -p "$work/ctx"
python3 - "$work/ctx" <<'EOF'
import configparser, os, shutil, ssl, subprocess, sys

ctx = sys.argv[1]
candidates = [os.environ.get(k) for k in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")]
candidates.append(ssl.get_default_verify_paths().openssl_cafile)
bundle = next((c for c in candidates if c and os.path.isfile(c)), None)
if bundle is None:
    sys.exit("no CA bundle found on this machine")
shutil.copyfile(bundle, os.path.join(ctx, "ca-certificates.crt"))

settings: dict[str, str] = {}
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                        text=True, check=False).stdout
for line in listed.splitlines():  # section.key='value', later files win
    key, _, value = line.partition("=")
    settings[key.split(".", 1)[-1]] = value.strip().strip("'\"")
for key, value in os.environ.items():
    if key.startswith("PIP_"):
        settings[key[4:].lower().replace("_", "-")] = value

def remote(value: str) -> str:
    return " ".join(u for u in value.split() if u.startswith(("http://", "https://")))

conf = configparser.ConfigParser()
conf["global"] = {"cert": "/etc/ssl/certs/ca-certificates.crt"}
for key in ("index-url", "extra-index-url"):
    if remote(settings.get(key, "")):
        conf["global"][key] = remote(settings[key])
for key in ("trusted-host", "timeout", "default-timeout", "retries", "proxy"):
    if settings.get(key):
        conf["global"][key] = settings[key]
with open(os.path.join(ctx, "pip.conf"), "w") as f:
    conf.write(f)
EOF

build() {  # name, packages, then Dockerfile lines after the install
    local name=$1 packages=$2
    shift 2
    {
        echo "FROM $ROOTFS"
        echo "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y" \
             "--no-install-recommends $packages && rm -rf /var/lib/apt/lists/*"
        echo "COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt"
        echo "COPY pip.conf /etc/pip.conf"
        echo "LABEL $LABEL"
        printf '%s\n' "$@"
    } >"$work/ctx/Dockerfile"
    docker build --network host -q -t "$name" "$work/ctx" >/dev/null
}

if ! have "$PYTHON"; then
    echo "building stand-in $PYTHON" >&2
    build "$PYTHON" "python3 python3-venv ca-certificates" 'CMD ["python3"]'
fi
if ! have "$REDIS"; then
    echo "building stand-in $REDIS" >&2
    build "$REDIS" "redis-server" "RUN mkdir -p /data" "WORKDIR /data" 'CMD ["redis-server"]'
fi
