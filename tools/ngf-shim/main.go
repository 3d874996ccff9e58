// Command ngf-epp-shim is a wire-level stand-in for NGINX Gateway Fabric's endpoint-picker shim
// (`gateway endpoint-picker`, container endpoint-picker-shim), written for picker's tests and demo.
//
// NGF's own module (github.com/nginx/nginx-gateway-fabric/v2) is not served by the Go module proxy this project
// can reach (403 "This module version is not available"), so the shim cannot be built from it here. This program
// reproduces the shim's observable behaviour, as protocol.md §9 and docs/gateways.md describe it, with the same
// libraries (grpc-go, go-control-plane's ext_proc v3 types):
//
//   - HTTP on 127.0.0.1:54800 (--listen to change it); NGF's NJS module posts each request to it, with the
//     client's headers plus X-EPP-Host / X-EPP-Port naming the EndpointPicker, and the buffered body.
//   - A new gRPC connection per request (TLS without verification unless --endpoint-picker-disable-tls).
//   - request_headers: every header as key (Go's canonical case) and `value` string, end_of_stream false;
//     then one request_body with the whole body and end_of_stream true; then CloseSend, and read until EOF.
//     No protocol_config, no :path or :method, no metadata, no response phases.
//   - An ImmediateResponse: its status code and body. Otherwise 200, with X-Gateway-Destination-Endpoint set
//     from the raw_value of that set_headers entry of a request-headers answer; every other mutation is dropped.
//   - An empty body is refused (500), as NGF's shim does.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	eppHostHeader     = "X-EPP-Host"
	eppPortHeader     = "X-EPP-Port"
	destinationKey    = "x-gateway-destination-endpoint"
	destinationHeader = "X-Gateway-Destination-Endpoint"
	maxBodyBytes      = 64 << 20
	defaultListenAddr = "127.0.0.1:54800"
	readHeaderTimeout = 10 * time.Second
)

type shim struct {
	disableTLS bool
	skipVerify bool
	verbose    bool
}

func (s *shim) credentials() grpc.DialOption {
	if s.disableTLS {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: s.skipVerify})) //nolint:gosec
}

func (s *shim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host, port := r.Header.Get(eppHostHeader), r.Header.Get(eppPortHeader)
	if host == "" || port == "" {
		http.Error(w, fmt.Sprintf("missing header %s or %s", eppHostHeader, eppPortHeader), http.StatusBadRequest)
		return
	}
	if r.ContentLength == 0 {
		http.Error(w, "request body is empty", http.StatusInternalServerError)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes))
	if err != nil {
		http.Error(w, fmt.Sprintf("reading the request body: %v", err), http.StatusInternalServerError)
		return
	}
	target := net.JoinHostPort(host, port)
	conn, err := grpc.NewClient(target, s.credentials())
	if err != nil {
		http.Error(w, fmt.Sprintf("creating the gRPC client: %v", err), http.StatusInternalServerError)
		return
	}
	defer conn.Close()

	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(r.Context())
	if err != nil {
		http.Error(w, fmt.Sprintf("opening the ext_proc stream: %v", err), http.StatusBadGateway)
		return
	}
	if err := stream.Send(headersMessage(r.Header)); err != nil {
		http.Error(w, fmt.Sprintf("sending headers: %v", err), http.StatusBadGateway)
		return
	}
	bodyMsg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true},
	}}
	if err := stream.Send(bodyMsg); err != nil {
		http.Error(w, fmt.Sprintf("sending the body: %v", err), http.StatusBadGateway)
		return
	}
	if err := stream.CloseSend(); err != nil {
		http.Error(w, fmt.Sprintf("closing the stream: %v", err), http.StatusInternalServerError)
		return
	}
	for {
		answer, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			http.Error(w, fmt.Sprintf("receiving from ext_proc: %v", err), http.StatusBadGateway)
			return
		}
		if immediate := answer.GetImmediateResponse(); immediate != nil {
			code := int(immediate.GetStatus().GetCode())
			if code == 0 {
				code = http.StatusInternalServerError
			}
			http.Error(w, string(immediate.GetBody()), code)
			return
		}
		for _, option := range answer.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if option.GetHeader().GetKey() == destinationKey {
				w.Header().Set(destinationHeader, string(option.GetHeader().GetRawValue()))
			}
		}
	}
	if s.verbose {
		log.Printf("endpoint for %s: %q", target, w.Header().Get(destinationHeader))
	}
	w.WriteHeader(http.StatusOK)
}

func headersMessage(h http.Header) *extprocv3.ProcessingRequest {
	values := make([]*corev3.HeaderValue, 0, len(h))
	for key, list := range h {
		for _, v := range list {
			values = append(values, &corev3.HeaderValue{Key: key, Value: v})
		}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: values}},
	}}
}

func main() {
	listen := flag.String("listen", defaultListenAddr, "address to serve the NJS module's requests on")
	disableTLS := flag.Bool("endpoint-picker-disable-tls", false, "plaintext gRPC to the EndpointPicker")
	skipVerify := flag.Bool("endpoint-picker-tls-skip-verify", true, "do not verify the EndpointPicker's certificate")
	verbose := flag.Bool("v", false, "log each pick")
	flag.Parse()
	server := &http.Server{
		Addr:              *listen,
		Handler:           &shim{disableTLS: *disableTLS, skipVerify: *skipVerify, verbose: *verbose},
		ReadHeaderTimeout: readHeaderTimeout,
		BaseContext:       func(net.Listener) context.Context { return context.Background() },
	}
	log.Printf("ngf-epp-shim listening on %s (tls: %v)", *listen, !*disableTLS)
	// SIGTERM/SIGINT: stop accepting, let requests in flight finish, exit 0 (as a container should).
	stop, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	failed := make(chan error, 1)
	go func() { failed <- server.ListenAndServe() }()
	select {
	case err := <-failed:
		log.Print(err)
		os.Exit(1)
	case <-stop.Done():
	}
	ctx, done := context.WithTimeout(context.Background(), 10*time.Second)
	defer done()
	if err := server.Shutdown(ctx); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}
