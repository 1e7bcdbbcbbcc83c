package clusterdns

import (
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// BenchmarkClusterIPQuery asks the server, over UDP on loopback, for a
// ClusterIP Service's A record from 16 concurrent clients, and reports
// queries/s and the p99 latency. `make bench` runs it beside the pod
// startup benchmark:
//
//	go test -run '^$' -bench ClusterIPQuery -benchtime 100000x ./clusterdns/
func BenchmarkClusterIPQuery(b *testing.B) {
	d := startServer(b, "cluster.local", fixtures()...)
	const clients = 16
	lat := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	per := b.N/clients + 1
	b.ResetTimer()
	start := time.Now()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("udp", d.addr)
			if err != nil {
				b.Error(err)
				return
			}
			defer conn.Close()
			co := &dns.Conn{Conn: conn}
			m := new(dns.Msg)
			m.SetQuestion("web.prod.svc.cluster.local.", dns.TypeA)
			for i := 0; i < per; i++ {
				t0 := time.Now()
				m.Id = dns.Id()
				if err := co.WriteMsg(m); err != nil {
					b.Error(err)
					return
				}
				r, err := co.ReadMsg()
				if err != nil || len(r.Answer) != 1 {
					b.Errorf("answer %v, %v", r, err)
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	if len(all) > 0 {
		b.ReportMetric(float64(len(all))/elapsed.Seconds(), "queries/s")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	}
}
