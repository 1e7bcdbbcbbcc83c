package iptables

// Supported reports whether this machine can run the iptables backend: the
// iptables binaries are installed and the nat table can be read. The error
// wraps dataplane.ErrNotSupported and says what is missing.
func Supported() error { return supported() }
