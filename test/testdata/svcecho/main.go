// Command svcecho is a tiny service the service URL tests run inside a
// sandbox (built static and copied in by the test):
//
//	svcecho serve PORT        HTTP on 0.0.0.0:PORT: /hello (a small body),
//	                          /headers (the request's headers as text),
//	                          /stream (three flushed lines), /ws (WebSocket echo)
//	svcecho bench URL N       N GETs of URL on one keep-alive connection;
//	                          prints each round trip in nanoseconds, one per line
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"time"

	"golang.org/x/net/websocket"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: svcecho serve PORT | svcecho bench URL N")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2])
	case "bench":
		n, err := strconv.Atoi(os.Args[3])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		bench(os.Args[2], n)
	default:
		os.Exit(2)
	}
}

func serve(port string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello from inside\n")
	})
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		keys := make([]string, 0, len(r.Header))
		for k := range r.Header {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(w, "Host: %s\n", r.Host)
		for _, k := range keys {
			fmt.Fprintf(w, "%s: %s\n", k, r.Header[k])
		}
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		for i := range 3 {
			fmt.Fprintf(w, "tick %d\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(300 * time.Millisecond)
		}
	})
	mux.Handle("/ws", websocket.Handler(func(c *websocket.Conn) { _, _ = io.Copy(c, c) }))
	if err := http.ListenAndServe(":"+port, mux); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func bench(url string, n int) {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	for i := 0; i < n; i++ {
		start := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Println(time.Since(start).Nanoseconds())
	}
}
