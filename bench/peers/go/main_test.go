// Tests of the Go peer: every shape completes and yields one positive sample
// per iteration, skynet's tree sums correctly, the latch signals exactly at
// zero, and the RESULT line has the shape compare.sh parses.
// Run with: GOPROXY=off GOFLAGS=-mod=mod go test .
package main

import (
	"regexp"
	"runtime"
	"testing"
	"time"
)

func checkSamples(t *testing.T, name string, samples []int64, iters int) {
	t.Helper()
	if len(samples) != iters {
		t.Fatalf("%s: %d samples, want %d", name, len(samples), iters)
	}
	for i, v := range samples {
		if v <= 0 {
			t.Fatalf("%s: sample %d is %d ns", name, i, v)
		}
	}
}

func TestEveryShapeCompletes(t *testing.T) {
	runtime.GOMAXPROCS(2)
	const iters = 2
	runs := map[string]func() []int64{
		"spawn_many_local":        func() []int64 { return spawnManyLocal(iters) },
		"spawn_many_remote_idle":  func() []int64 { return spawnManyRemoteIdle(iters) },
		"spawn_many_remote_busy1": func() []int64 { return spawnManyRemoteBusy1(2, iters) },
		"spawn_many_remote_busy2": func() []int64 { return spawnManyRemoteBusy2(2, iters) },
		"ping_pong":               func() []int64 { return pingPong(iters) },
		"yield_many":              func() []int64 { return yieldMany(iters) },
		"chained_spawn":           func() []int64 { return chainedSpawn(iters) },
		"skynet":                  func() []int64 { return skynet(iters) },
	}
	if len(runs) != len(shapes) {
		t.Fatalf("%d shapes tested, %d declared", len(runs), len(shapes))
	}
	for _, name := range shapes {
		run, ok := runs[name]
		if !ok {
			t.Fatalf("shape %s has no test", name)
		}
		checkSamples(t, name, run(), iters)
	}
}

func TestSkynetSumsEveryLeaf(t *testing.T) {
	for _, leaves := range []int64{1, 10, 1000} {
		c := make(chan int64, 1)
		go skynetNode(c, 0, leaves)
		if got, want := <-c, leaves*(leaves-1)/2; got != want {
			t.Fatalf("skynet over %d leaves = %d, want %d", leaves, got, want)
		}
	}
}

func TestLatchSignalsOnlyAtZero(t *testing.T) {
	l := newLatch(3)
	l.arrive()
	l.arrive()
	select {
	case <-l.done:
		t.Fatal("latch signalled with one arrival outstanding")
	case <-time.After(10 * time.Millisecond):
	}
	go l.arrive()
	select {
	case <-l.done:
	case <-time.After(5 * time.Second):
		t.Fatal("latch never signalled after the last arrival")
	}
}

func TestResultLineProtocol(t *testing.T) {
	got := resultLine("ping_pong", []int64{5, 17, 3}, 2048)
	want := "RESULT shape=ping_pong iters=3 samples_ns=5,17,3 rss_kb=2048"
	if got != want {
		t.Fatalf("resultLine = %q, want %q", got, want)
	}
	re := regexp.MustCompile(`^RESULT shape=[a-z0-9_]+ iters=[0-9]+ samples_ns=[0-9]+(,[0-9]+)* rss_kb=[0-9]+$`)
	if !re.MatchString(got) {
		t.Fatalf("resultLine %q does not match the protocol", got)
	}
	if rss := peakRSSKiB(); rss <= 0 {
		t.Fatalf("peak RSS %d KiB", rss)
	}
}
