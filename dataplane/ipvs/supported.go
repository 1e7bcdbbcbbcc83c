package ipvs

// Supported reports whether the kernel has IPVS: /proc/net/ip_vs exists, or
// appears after loading the ip_vs module. The error wraps
// dataplane.ErrNotSupported and says what to use instead.
func Supported() error { return supported() }
