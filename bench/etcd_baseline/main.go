// etcd_baseline: the baseline of `farmem bench cluster` — metadata put/get latency with etcd's own
// Go client (clientv3, the library etcdctl is built on) in one process, so process start-up is not
// counted. Prints one JSON object: {"put_ns":[...],"get_ns":[...]}.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "comma-separated etcd endpoints")
	prefix := flag.String("prefix", "/farmem/bench/meta/", "key prefix")
	ops := flag.Int("ops", 200, "put and get calls each")
	valueSize := flag.Int("value-size", 100, "value bytes")
	flag.Parse()

	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(*endpoints, ","),
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd_baseline:", err)
		os.Exit(1)
	}
	defer cli.Close()
	value := strings.Repeat("v", *valueSize)
	ctx := context.Background()
	// Warm-up: the connection is open and the keys exist before anything is timed.
	for i := 0; i < 16; i++ {
		if _, err := cli.Put(ctx, fmt.Sprintf("%skv/%d", *prefix, i), value); err != nil {
			fmt.Fprintln(os.Stderr, "etcd_baseline: put:", err)
			os.Exit(1)
		}
	}
	putNs := make([]int64, 0, *ops)
	getNs := make([]int64, 0, *ops)
	for i := 0; i < *ops; i++ {
		key := fmt.Sprintf("%skv/%d", *prefix, i%16)
		t0 := time.Now()
		if _, err := cli.Put(ctx, key, value); err != nil {
			fmt.Fprintln(os.Stderr, "etcd_baseline: put:", err)
			os.Exit(1)
		}
		putNs = append(putNs, time.Since(t0).Nanoseconds())
		t0 = time.Now()
		r, err := cli.Get(ctx, key)
		if err != nil || len(r.Kvs) != 1 {
			fmt.Fprintln(os.Stderr, "etcd_baseline: get:", err)
			os.Exit(1)
		}
		getNs = append(getNs, time.Since(t0).Nanoseconds())
	}
	out, _ := json.Marshal(map[string][]int64{"put_ns": putNs, "get_ns": getNs})
	fmt.Println(string(out))
}
