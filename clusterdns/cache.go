package clusterdns

import (
	"fmt"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// msgCache keeps forwarded answers: positive ones for their smallest TTL,
// negative ones (NXDOMAIN, and NOERROR without answers) for the SOA's
// minimum (RFC 2308), both capped by max. SERVFAIL is not kept.
type msgCache struct {
	mu      sync.Mutex
	size    int
	max     time.Duration
	entries map[string]cacheEntry
	now     func() time.Time // read under mu (tests move the clock)
}

type cacheEntry struct {
	msg     *dns.Msg
	stored  time.Time
	expires time.Time
}

func newMsgCache(size int, max time.Duration) *msgCache {
	return &msgCache{size: size, max: max, entries: map[string]cacheEntry{}, now: time.Now}
}

func cacheKey(q dns.Question, do bool) string {
	return fmt.Sprintf("%s/%d/%d/%t", dns.CanonicalName(q.Name), q.Qtype, q.Qclass, do)
}

// ttlOf is how long m may be kept.
func (c *msgCache) ttlOf(m *dns.Msg) (time.Duration, bool) {
	switch {
	case m.Rcode == dns.RcodeSuccess && len(m.Answer) > 0:
		min := uint32(1<<32 - 1)
		for _, rr := range m.Answer {
			if rr.Header().Ttl < min {
				min = rr.Header().Ttl
			}
		}
		return c.cap(time.Duration(min) * time.Second), true
	case m.Rcode == dns.RcodeNameError || m.Rcode == dns.RcodeSuccess:
		for _, rr := range m.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				ttl := soa.Minttl
				if soa.Hdr.Ttl < ttl {
					ttl = soa.Hdr.Ttl
				}
				return c.cap(time.Duration(ttl) * time.Second), true
			}
		}
		return c.cap(5 * time.Second), true
	}
	return 0, false
}

func (c *msgCache) cap(d time.Duration) time.Duration {
	if d > c.max {
		return c.max
	}
	return d
}

func (c *msgCache) put(key string, m *dns.Msg) {
	ttl, ok := c.ttlOf(m)
	if !ok || ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if len(c.entries) >= c.size {
		// Drop expired entries first, then arbitrary ones (map order).
		for k, e := range c.entries {
			if len(c.entries) < c.size && !now.After(e.expires) {
				break
			}
			delete(c.entries, k)
		}
	}
	c.entries[key] = cacheEntry{msg: m.Copy(), stored: now, expires: now.Add(ttl)}
}

// get returns a copy of the cached answer with its TTLs lowered by the time
// it has been kept, or nil.
func (c *msgCache) get(key string) *dns.Msg {
	c.mu.Lock()
	now := c.now()
	e, ok := c.entries[key]
	if ok && !now.Before(e.expires) {
		delete(c.entries, key)
		ok = false
	}
	c.mu.Unlock()
	if !ok {
		return nil
	}
	m := e.msg.Copy()
	age := uint32(now.Sub(e.stored) / time.Second)
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			if rr.Header().Rrtype == dns.TypeOPT {
				continue
			}
			if h := rr.Header(); h.Ttl > age {
				h.Ttl -= age
			} else {
				h.Ttl = 0
			}
		}
	}
	return m
}

// Len returns how many answers are kept.
func (c *msgCache) Len() int { c.mu.Lock(); defer c.mu.Unlock(); return len(c.entries) }
