//go:build !linux

package l2announce

import (
	"errors"
	"net/netip"
)

func newResponder(Config, func(netip.Addr) bool) (responder, error) {
	return nil, errors.New("L2 announcement needs Linux (AF_PACKET)")
}
