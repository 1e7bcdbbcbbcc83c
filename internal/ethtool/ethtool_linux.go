// Package ethtool holds the few ethtool ioctls Waggle needs, without the
// ethtool binary.
package ethtool

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SetTxChecksum turns transmit checksum offload of ifname (in the calling
// thread's network namespace) on or off, as `ethtool -K <if> tx on|off`.
// Off, the sender computes full TCP/UDP checksums, as a packet from another
// machine has them on the wire; on (a veth's default), its packets carry
// only the pseudo-header sum (CHECKSUM_PARTIAL), which XDP cannot complete.
func SetTxChecksum(ifname string, on bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	v := struct{ cmd, data uint32 }{cmd: 0x17} // ETHTOOL_STXCSUM
	if on {
		v.data = 1
	}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer // ifr_data: the ethtool command
		_    [16]byte       // the rest of struct ifreq's union
	}
	copy(ifr.name[:unix.IFNAMSIZ-1], ifname)
	ifr.data = unsafe.Pointer(&v)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(&v)
	if errno != 0 {
		return errno
	}
	return nil
}
