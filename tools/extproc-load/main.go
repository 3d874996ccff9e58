// Command extproc-load drives an ext_proc server the way Envoy does in FULL_DUPLEX_STREAMED mode, for
// `picker bench overhead`: a new gRPC stream per HTTP request, request headers (with protocol_config), the body in
// chunks of at most 64 KiB with end_of_stream on the last, then half-close; it reads until the body comes back with
// end_of_stream (or an ImmediateResponse arrives).
//
// It exists because the benchmark's Python client (picker/bench/extproc_client.py) spends about a millisecond of
// CPU per request: on a 2-core machine it takes a core from the server it measures. Envoy, the real client, is
// compiled; so is this one (grpc-go and go-control-plane's ext_proc v3 types, as NGF's shim).
//
// Two modes, one JSON object on stdout:
//
//	-mode latency:    -requests sequential requests on one connection (after -warmup), each decision time
//	                  (last body byte sent -> headers answer received) in "decisions_s";
//	-mode throughput: -concurrency streams in a loop over -connections connections for -duration:
//	                  "completed", "failed", "elapsed_s".
//
// -bodies names a file of request bodies, one per line (the benchmark writes the same prompts it gives the Python
// client); request i uses body i modulo their number. With -fresh every request's prompt starts with a number of its
// own ("g<n> "), so no two requests share a prompt block and picker's prefix index learns each one as new.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	chunkBytes      = 64 * 1024
	maxMessageBytes = 64 << 20
	destinationKey  = "x-gateway-destination-endpoint"
	errorPause      = 10 * time.Millisecond
	// Envoy's HTTP/2 default stream and connection windows (256 MiB), set statically as Envoy does: a static
	// window also turns off grpc-go's BDP probing, whose pings Envoy would not send.
	windowBytes = 256 << 20
)

// The headers picker/bench/overhead.py sends (plus content-length, per body).
var baseHeaders = [][2]string{
	{":method", "POST"},
	{":path", "/v1/completions"},
	{":authority", "gateway"},
	{":scheme", "http"},
	{"content-type", "application/json"},
	{"user-agent", "bench"},
	{"accept", "*/*"},
}

type exchange struct {
	status   int
	decision time.Duration
}

type result struct {
	Mode        string    `json:"mode"`
	Completed   int64     `json:"completed"`
	Failed      int64     `json:"failed"`
	ElapsedS    float64   `json:"elapsed_s"`
	DecisionsS  []float64 `json:"decisions_s,omitempty"`
	Connections int       `json:"connections"`
}

func main() {
	target := flag.String("target", "", "host:port of the ext_proc server (plaintext)")
	bodiesPath := flag.String("bodies", "", "file of request bodies, one per line")
	mode := flag.String("mode", "throughput", "latency or throughput")
	requests := flag.Int("requests", 300, "latency mode: sequential requests")
	warmup := flag.Int("warmup", 20, "requests before measuring (each connection)")
	duration := flag.Duration("duration", 5*time.Second, "throughput mode: how long")
	concurrency := flag.Int("concurrency", 64, "throughput mode: concurrent streams")
	connections := flag.Int("connections", 8, "throughput mode: TCP connections")
	fresh := flag.Bool("fresh", false, "a prompt of its own for every request (a number at its start)")
	flag.Parse()
	if *target == "" || *bodiesPath == "" {
		fail(errors.New("-target and -bodies are required"))
	}
	messages, err := loadRequests(*bodiesPath, *fresh)
	if err != nil {
		fail(err)
	}
	var out result
	switch *mode {
	case "latency":
		out, err = runLatency(*target, messages, *requests, *warmup)
	case "throughput":
		out, err = runThroughput(*target, messages, *duration, *concurrency, *connections, *warmup)
	default:
		err = fmt.Errorf("unknown -mode %q", *mode)
	}
	if err != nil {
		fail(err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "extproc-load:", err)
	os.Exit(1)
}

// promptStart is where a fresh request's number goes: the start of the JSON body's "prompt" string.
var promptStart = []byte(`"prompt":"`)

// requestSource hands out each request's messages: the bodies in turn, or with fresh a new prompt each time.
type requestSource struct {
	bodies [][]byte
	built  [][]*extprocv3.ProcessingRequest
	fresh  bool
	count  atomic.Int64
}

func (r *requestSource) get(i int) []*extprocv3.ProcessingRequest {
	if !r.fresh {
		return r.built[i%len(r.built)]
	}
	n := r.count.Add(1)
	body := r.bodies[int(n%int64(len(r.bodies)))]
	at := bytes.Index(body, promptStart) + len(promptStart)
	numbered := make([]byte, 0, len(body)+24)
	numbered = append(numbered, body[:at]...)
	numbered = append(numbered, 'g')
	numbered = strconv.AppendInt(numbered, n, 10)
	numbered = append(numbered, ' ')
	numbered = append(numbered, body[at:]...)
	return buildMessages(numbered)
}

func loadRequests(path string, fresh bool) (*requestSource, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := &requestSource{fresh: fresh}
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), maxMessageBytes)
	for scanner.Scan() {
		body := append([]byte(nil), scanner.Bytes()...)
		if fresh && !bytes.Contains(body, promptStart) {
			return nil, fmt.Errorf("%s: -fresh needs bodies with a \"prompt\" string", path)
		}
		out.bodies = append(out.bodies, body)
		out.built = append(out.built, buildMessages(body))
	}
	if err := scanner.Err(); err != nil {
		return nil, err
	}
	if len(out.bodies) == 0 {
		return nil, fmt.Errorf("%s: no bodies", path)
	}
	return out, nil
}

func buildMessages(body []byte) []*extprocv3.ProcessingRequest {
	values := make([]*corev3.HeaderValue, 0, len(baseHeaders)+1)
	for _, kv := range baseHeaders {
		values = append(values, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	values = append(values, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))})
	msgs := []*extprocv3.ProcessingRequest{{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers:     &corev3.HeaderMap{Headers: values},
			EndOfStream: len(body) == 0,
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
	}}
	for start := 0; start < len(body); start += chunkBytes {
		end := min(start+chunkBytes, len(body))
		msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[start:end], EndOfStream: end == len(body)},
		}})
	}
	return msgs
}

func dial(target string) (*grpc.ClientConn, extprocv3.ExternalProcessorClient, error) {
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageBytes), grpc.MaxCallSendMsgSize(maxMessageBytes)),
		grpc.WithInitialWindowSize(windowBytes),
		grpc.WithInitialConnWindowSize(windowBytes),
	)
	if err != nil {
		return nil, nil, err
	}
	return conn, extprocv3.NewExternalProcessorClient(conn), nil
}

// run sends one request's messages on a new stream and reads the answers.
func run(client extprocv3.ExternalProcessorClient, messages []*extprocv3.ProcessingRequest) (exchange, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // ends the stream once the body is back, as Envoy does
	stream, err := client.Process(ctx)
	if err != nil {
		return exchange{}, err
	}
	for _, m := range messages {
		if err := stream.Send(m); err != nil {
			return exchange{}, err
		}
	}
	sent := time.Now()
	if err := stream.CloseSend(); err != nil {
		return exchange{}, err
	}
	out := exchange{status: 200}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return exchange{}, err
		}
		switch r := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			out.status = int(r.ImmediateResponse.GetStatus().GetCode())
			out.decision = time.Since(sent)
			return out, nil
		case *extprocv3.ProcessingResponse_RequestHeaders:
			out.decision = time.Since(sent)
			if !hasDestination(r.RequestHeaders) {
				out.status = 0 // routed without a destination: a failure for the benchmark
			}
			if len(messages) == 1 {
				return out, nil
			}
		case *extprocv3.ProcessingResponse_RequestBody:
			if r.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
				return out, nil
			}
		}
	}
}

func hasDestination(h *extprocv3.HeadersResponse) bool {
	for _, opt := range h.GetResponse().GetHeaderMutation().GetSetHeaders() {
		if opt.GetHeader().GetKey() == destinationKey && len(opt.GetHeader().GetRawValue()) > 0 {
			return true
		}
	}
	return false
}

func runLatency(target string, messages *requestSource, requests, warmup int) (result, error) {
	conn, client, err := dial(target)
	if err != nil {
		return result{}, err
	}
	defer conn.Close()
	out := result{Mode: "latency", Connections: 1, DecisionsS: make([]float64, 0, requests)}
	for i := range warmup {
		if _, err := run(client, messages.get(i)); err != nil {
			return result{}, err
		}
	}
	started := time.Now()
	for i := range requests {
		ex, err := run(client, messages.get(i))
		if err != nil {
			return result{}, err
		}
		out.Completed++
		if ex.status != 200 {
			out.Failed++
		}
		out.DecisionsS = append(out.DecisionsS, ex.decision.Seconds())
	}
	out.ElapsedS = time.Since(started).Seconds()
	return out, nil
}

func runThroughput(
	target string, messages *requestSource, duration time.Duration, concurrency, connections, warmup int,
) (result, error) {
	connections = max(1, min(connections, concurrency))
	clients := make([]extprocv3.ExternalProcessorClient, connections)
	for i := range clients {
		conn, client, err := dial(target)
		if err != nil {
			return result{}, err
		}
		defer conn.Close()
		clients[i] = client
		for w := range max(1, warmup/connections) { // connect (and warm) every connection before the clock starts
			if _, err := run(client, messages.get(w)); err != nil {
				return result{}, err
			}
		}
	}
	var completed, failed atomic.Int64
	var firstErr error
	var errOnce sync.Once
	started := time.Now()
	deadline := started.Add(duration)
	var wg sync.WaitGroup
	for w := range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := clients[w%connections]
			for i := w; time.Now().Before(deadline); i += concurrency {
				ex, err := run(client, messages.get(i))
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					failed.Add(1)
					time.Sleep(errorPause) // a server that is down is not hammered in a tight loop
					continue
				}
				completed.Add(1)
				if ex.status != 200 {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(started).Seconds()
	if firstErr != nil && completed.Load() == 0 {
		return result{}, firstErr
	}
	return result{
		Mode: "throughput", Completed: completed.Load(), Failed: failed.Load(), ElapsedS: elapsed,
		Connections: connections,
	}, nil
}
