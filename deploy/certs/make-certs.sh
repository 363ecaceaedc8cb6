#!/usr/bin/env bash
# A private CA and the mTLS certificates a shardrec job needs (openssl).
#
#   make-certs.sh OUTDIR SERVER_NAME[,SERVER_NAME...] [CLIENT_NAME...]
#
# OUTDIR/ca.pem, ca.key        the CA (keep ca.key off the cluster)
# OUTDIR/server.pem, .key      one server certificate whose SAN DNS names are
#                              every SERVER_NAME (the names the trainers dial
#                              in --shard-servers: host names, or the pods'
#                              names under the headless Service)
# OUTDIR/NAME.pem, NAME.key    a client certificate per CLIENT_NAME (CN and
#                              SAN DNS name NAME; default: trainer ops), the
#                              names serve --allow-push / --allow-admin list
# Certificates are valid for 365 days (DAYS=N to change). An existing OUTDIR/ca.pem
# and ca.key are reused, so new servers or clients join the same CA.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
OUT=$1
SERVERS=$2
shift 2
CLIENTS=("$@")
[ ${#CLIENTS[@]} -gt 0 ] || CLIENTS=(trainer ops)
DAYS=${DAYS:-365}
command -v openssl >/dev/null || { echo "make-certs.sh: openssl is not installed" >&2; exit 2; }
mkdir -p "$OUT"
umask 077

if [ ! -f "$OUT/ca.pem" ] || [ ! -f "$OUT/ca.key" ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days "$DAYS" -subj "/CN=shardrec-ca" \
    -keyout "$OUT/ca.key" -out "$OUT/ca.pem" 2>/dev/null
fi

# sign NAME CN SAN_LIST EXT_USAGE: NAME.key, NAME.pem signed by the CA.
sign() {
  local name=$1 cn=$2 sans=$3 usage=$4 ext
  ext=$(mktemp)
  {
    echo "subjectAltName=$sans"
    echo "extendedKeyUsage=$usage"
    echo "basicConstraints=CA:FALSE"
  } >"$ext"
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$cn" -keyout "$OUT/$name.key" \
    -out "$OUT/$name.csr" 2>/dev/null
  openssl x509 -req -in "$OUT/$name.csr" -CA "$OUT/ca.pem" -CAkey "$OUT/ca.key" \
    -CAcreateserial -days "$DAYS" -extfile "$ext" -out "$OUT/$name.pem" 2>/dev/null
  rm -f "$OUT/$name.csr" "$ext"
}

sans=""
IFS=, read -r -a names <<<"$SERVERS"
for n in "${names[@]}"; do
  if [[ "$n" =~ ^[0-9.]+$ ]]; then sans+="${sans:+,}IP:$n"; else sans+="${sans:+,}DNS:$n"; fi
done
sign server "${names[0]}" "$sans" serverAuth
for c in "${CLIENTS[@]}"; do
  sign "$c" "$c" "DNS:$c" clientAuth
done
rm -f "$OUT/ca.srl"
chmod 644 "$OUT"/*.pem
echo "make-certs.sh: $OUT: ca.pem, server.pem/.key (${SERVERS}), ${CLIENTS[*]/%/.pem/.key}"
