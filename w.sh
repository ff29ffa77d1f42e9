socat TCP-LISTEN:8000,bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:/run/relay/s.sock &
i=0
while :; do
  found=
  while read -r _ l _ st _; do [ "$l $st" = "0100007F:1F40 0A" ] && found=1; done < /proc/net/tcp
  [ -n "$found" ] && break
  i=$((i+1))
done
echo "ready after $i polls"
exec "$@"
