// Command egressclient is the client side of the egress benchmarks (see
// bench/egress.go). It runs inside a sandbox in egress mode, where it
// follows HTTPS_PROXY and SSL_CERT_FILE like most programs do, and on the
// host for the direct baseline (EGRESSCLIENT_DIAL=ADDR then connects every
// request straight to ADDR, keeping the URL's name for TLS). It prints one
// duration in nanoseconds per timed run.
//
//	egressclient latency URL N WARMUP         small GETs over one keep-alive connection
//	egressclient throughput HOST:PORT BYTES N WARMUP
//	                                          BYTES through a fresh CONNECT tunnel per run;
//	                                          the sink answers one byte once it read them all
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "egressclient:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 1 {
		return errors.New("usage: latency URL N WARMUP | throughput HOST:PORT BYTES N WARMUP")
	}
	num := func(s string) int {
		n, _ := strconv.Atoi(s)
		return n
	}
	switch {
	case args[0] == "latency" && len(args) == 4:
		return latency(args[1], num(args[2]), num(args[3]))
	case args[0] == "throughput" && len(args) == 5:
		return throughput(args[1], int64(num(args[2])), num(args[3]), num(args[4]))
	}
	return errors.New("bad arguments")
}

func latency(u string, n, warmup int) error {
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 1}
	if addr := os.Getenv("EGRESSCLIENT_DIAL"); addr != "" {
		tr.Proxy = nil
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	}
	c := &http.Client{Transport: tr}
	for i := 0; i < warmup+n; i++ {
		start := time.Now()
		resp, err := c.Get(u)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", u, resp.Status)
		}
		if i >= warmup {
			fmt.Println(d.Nanoseconds())
		}
	}
	return nil
}

func throughput(dest string, size int64, n, warmup int) error {
	p := os.Getenv("HTTPS_PROXY")
	if p == "" {
		return errors.New("HTTPS_PROXY is not set")
	}
	pu, err := url.Parse(p)
	if err != nil {
		return err
	}
	buf := make([]byte, 256<<10)
	for i := 0; i < warmup+n; i++ {
		start := time.Now()
		c, err := net.Dial("tcp", pu.Host)
		if err != nil {
			return err
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			c.Close()
			return err
		}
		if resp.StatusCode != http.StatusOK {
			c.Close()
			return fmt.Errorf("CONNECT %s: %s", dest, resp.Status)
		}
		for left := size; left > 0; {
			k := min(left, int64(len(buf)))
			if _, err := c.Write(buf[:k]); err != nil {
				c.Close()
				return err
			}
			left -= k
		}
		_ = c.(*net.TCPConn).CloseWrite()
		var ack [1]byte
		if _, err := io.ReadFull(br, ack[:]); err != nil {
			c.Close()
			return fmt.Errorf("waiting for the sink: %w", err)
		}
		d := time.Since(start)
		c.Close()
		if i >= warmup {
			fmt.Println(d.Nanoseconds())
		}
	}
	return nil
}
