// Command mketcd35 writes the etcd 3.5 data dir of
// ../etcd-3.5.17-datadir.tar.gz with the embedded etcd of v3.5.17 (what
// Waggle ran before etcd 3.7): go run . DIR; then tar -czf ... -C DIR member.
package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	ec := embed.NewConfig()
	ec.Name = "waggle"
	ec.Dir = os.Args[1]
	ec.LogLevel = "error"
	cu := url.URL{Scheme: "http", Host: "127.0.0.1:23790"}
	pu := url.URL{Scheme: "http", Host: "127.0.0.1:23800"}
	adv := url.URL{Scheme: "http", Host: "127.0.0.1:2380"}
	ec.ListenClientUrls = []url.URL{cu}
	ec.AdvertiseClientUrls = []url.URL{cu}
	ec.ListenPeerUrls = []url.URL{pu}
	ec.AdvertisePeerUrls = []url.URL{adv}
	ec.InitialCluster = ec.Name + "=" + adv.String()
	e, err := embed.StartEtcd(ec)
	if err != nil {
		panic(err)
	}
	<-e.Server.ReadyNotify()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{cu.String()}, DialTimeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := c.Put(context.Background(), fmt.Sprintf("/registry/configmaps/default/cm-%d", i), fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-%d","namespace":"default"},"data":{"k":"v%d"}}`, i, i)); err != nil {
			panic(err)
		}
	}
	c.Close()
	e.Close()
	fmt.Println("wrote etcd 3.5 data dir", ec.Dir)
}
