#!/bin/sh
# A container's filesystem for a simulated pod (tests/kubernetes/podsim.py): run as
#   ip netns exec NS unshare --mount --uts --propagation private sh sandbox.sh ROOT WORKDIR HOSTNAME MOUNTS -- CMD ARGS...
# In its own mount namespace it builds ROOT from this machine's directories (the "image"), a
# private /dev (with the pod's /dev/shm and termination message), the pod's volumes at their
# mountPaths (MOUNTS: lines "bind SRC DST [ro]", "tmpfs DST", "file SRC DST"), sets the pod's
# hostname, and runs CMD in WORKDIR inside it. Nothing it mounts is visible outside.
set -eu
R=$1; W=$2; H=$3; M=$4; shift 5
mount -t tmpfs -o mode=0755 phx-pod "$R"
for d in /*; do
  name=${d#/}
  case "$name" in proc|sys|dev|lost+found|'*') continue;; esac
  if [ -L "$d" ]; then cp -P "$d" "$R/$name"; elif [ -d "$d" ]; then mkdir "$R/$name"; mount --rbind "$d" "$R/$name"; fi
done
mkdir "$R/proc" "$R/sys" "$R/dev"
mount --rbind /proc "$R/proc"
mount --rbind /sys "$R/sys"
mount -t tmpfs -o mode=0755 phx-dev "$R/dev"
for f in null zero full random urandom tty; do touch "$R/dev/$f"; mount --bind "/dev/$f" "$R/dev/$f"; done
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"
mkdir "$R/dev/pts" "$R/dev/shm"
mount --rbind /dev/pts "$R/dev/pts"
while read -r kind a b c; do
  case "$kind" in
    bind) mkdir -p "$R$b"; mount --bind "$a" "$R$b"; if [ "${c:-}" = ro ]; then mount -o remount,bind,ro "$R$b"; fi;;
    tmpfs) mkdir -p "$R$a"; mount -t tmpfs phx-mem "$R$a";;
    file) touch "$R$b"; mount --bind "$a" "$R$b";;
  esac
done < "$M"
hostname "$H"
exec chroot "$R" /bin/sh -c 'cd "$0" && exec "$@"' "$W" "$@"
