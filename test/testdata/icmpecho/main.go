// Command icmpecho is run inside a sandbox by TestAdversarialExecCaps: it
// sends one ICMP echo to 127.0.0.1 over an unprivileged datagram ICMP
// socket (net.ipv4.ping_group_range) and prints "pong" when the reply
// comes; it also reports whether a raw socket can be opened.
package main

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP); err != nil {
		fmt.Printf("raw socket: %v\n", err)
	} else {
		fmt.Printf("raw socket: opened\n")
		unix.Close(fd)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)
	if err != nil {
		fmt.Printf("dgram icmp socket: %v\n", err)
		os.Exit(1)
	}
	defer unix.Close(fd)
	// type 8 (echo request), code 0, checksum (the kernel fills it for
	// datagram ICMP sockets), id (the kernel sets it), seq 1, payload.
	msg := []byte{8, 0, 0, 0, 0, 0, 0, 1, 'a', 'b', 'x'}
	to := &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}
	if err := unix.Sendto(fd, msg, 0, to); err != nil {
		fmt.Printf("sendto: %v\n", err)
		os.Exit(1)
	}
	tv := unix.NsecToTimeval(int64(3 * time.Second))
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 128)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		fmt.Printf("recvfrom: %v\n", err)
		os.Exit(1)
	}
	if n < 8 || buf[0] != 0 {
		fmt.Printf("unexpected reply % x\n", buf[:n])
		os.Exit(1)
	}
	fmt.Println("pong")
}
