//! picker's ext_proc gRPC front (`picker.extproc._front`).
//!
//! HTTP/2, TLS and gRPC framing run here, on tokio threads that never take the GIL; Python sees only whole
//! messages. Each ext_proc stream gets an id. Inbound messages, half-closes and cancellations are queued as
//! events, and the queue's eventfd becomes readable when it goes from empty to non-empty, so an asyncio loop
//! (`loop.add_reader`) drains any number of events per wake-up under load. Python answers with `send` (bytes of
//! serialized `ProcessingResponse`s), `finish` (OK) or `abort` (a gRPC status); nothing here parses ext_proc
//! messages, so the protocol logic stays in one place (picker/extproc/stream.py).
//!
//! Health (`grpc.health.v1.Health`: Check, Watch, List) is answered here from a status table Python replaces
//! whenever it changes, so a gateway can health-check this port without a trip through Python.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::Stream;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{empty_body, Body, BoxFuture, StdError};
use tonic::server::{Grpc, NamedService, ServerStreamingService, StreamingService, UnaryService};
use tonic::transport::server::Connected;
use tonic::transport::Server;
use tonic::{Code, Status};

const MESSAGE: u8 = 0; // a ProcessingRequest's bytes
const END: u8 = 1; // the client half-closed: no more messages
const GONE: u8 = 2; // the call is over (answered, cancelled or reset): forget the stream
const STOPPED: u8 = 3; // after `begin_stop`: every connection has closed (stream id 0)

const PROCESS_PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";
const HEALTH_SERVICE_UNKNOWN: i32 = 3;

/// The queue's byte bound: room for a few of the largest messages, and 64 MiB at least.
fn queued_limit(max_message: usize) -> usize {
    max_message.saturating_mul(4).clamp(64 << 20, (u32::MAX >> 4) as usize)
}

type Reply = Result<Bytes, Status>;
type Event = (u64, u8, Option<Bytes>);

struct Shared {
    inbox: Mutex<Vec<Event>>,
    event_fd: i32,
    streams: Mutex<HashMap<u64, mpsc::UnboundedSender<Reply>>>,
    next_id: AtomicU64,
    health: watch::Sender<HashMap<String, i32>>,
    max_message: usize,
    /// Bytes of messages queued for Python and not yet drained, bounded: when Python falls behind, the readers
    /// wait, and HTTP/2 flow control pushes back on the clients instead of the queue growing without limit.
    queued_budget: tokio::sync::Semaphore,
    queued_limit: usize,
}

impl Shared {
    fn push(&self, id: u64, kind: u8, payload: Option<Bytes>) {
        let was_empty = {
            let mut inbox = self.inbox.lock().unwrap();
            let empty = inbox.is_empty();
            inbox.push((id, kind, payload));
            empty
        };
        if was_empty {
            // One wake-up per batch: Python reads the eventfd before it takes the inbox, so an event pushed after
            // the take finds the inbox empty and writes again.
            let one: u64 = 1;
            unsafe { libc::write(self.event_fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }
}

impl Shared {
    /// `push`, unless Python already ended the call (its later messages have no one to go to).
    fn push_open(&self, id: u64, kind: u8, payload: Option<Bytes>) -> bool {
        let streams = self.streams.lock().unwrap();
        let open = streams.contains_key(&id);
        if open {
            self.push(id, kind, payload);
        }
        open
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        unsafe { libc::close(self.event_fd) };
    }
}

// -- a codec that moves message bytes as they are -------------------------------------------------------------

#[derive(Clone, Copy, Default)]
struct RawCodec;
struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

fn unimplemented_response() -> http::Response<tonic::body::BoxBody> {
    let mut response = http::Response::new(empty_body());
    let headers = response.headers_mut();
    headers.insert(Status::GRPC_STATUS, (Code::Unimplemented as i32).into());
    headers.insert(http::header::CONTENT_TYPE, tonic::metadata::GRPC_CONTENT_TYPE);
    response
}

// -- ext_proc ---------------------------------------------------------------------------------------------

/// The answers of one stream. Dropped when the call ends for any reason: the stream is then forgotten here and
/// Python hears GONE (and the reader of the request side stops).
struct Replies {
    rx: mpsc::UnboundedReceiver<Reply>,
    shared: Arc<Shared>,
    id: u64,
    _stop_reader: oneshot::Sender<()>,
}

impl Stream for Replies {
    type Item = Reply;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Reply>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for Replies {
    fn drop(&mut self) {
        let known = self.shared.streams.lock().unwrap().remove(&self.id).is_some();
        if known {
            self.shared.push(self.id, GONE, None);
        }
    }
}

struct ProcessMethod(Arc<Shared>);

impl StreamingService<Bytes> for ProcessMethod {
    type Response = Bytes;
    type ResponseStream = Replies;
    type Future = BoxFuture<tonic::Response<Replies>, Status>;

    fn call(&mut self, request: tonic::Request<tonic::Streaming<Bytes>>) -> Self::Future {
        let shared = self.0.clone();
        Box::pin(async move {
            let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = mpsc::unbounded_channel();
            shared.streams.lock().unwrap().insert(id, tx);
            let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
            let mut inbound = request.into_inner();
            let reader = shared.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = &mut stop_rx => break,
                        item = inbound.message() => match item {
                            Ok(Some(message)) => {
                                let need = message.len().clamp(1, reader.queued_limit) as u32;
                                match reader.queued_budget.acquire_many(need).await {
                                    Ok(permit) => permit.forget(),
                                    Err(_) => break,
                                }
                                if !reader.push_open(id, MESSAGE, Some(message)) {
                                    reader.queued_budget.add_permits(need as usize);
                                }
                            }
                            Ok(None) => { reader.push_open(id, END, None); break; }
                            Err(_) => { reader.push_open(id, GONE, None); break; }
                        }
                    }
                }
            });
            Ok(tonic::Response::new(Replies { rx, shared, id, _stop_reader: stop_tx }))
        })
    }
}

#[derive(Clone)]
struct ExtProcService(Arc<Shared>);

impl NamedService for ExtProcService {
    const NAME: &'static str = "envoy.service.ext_proc.v3.ExternalProcessor";
}

impl<B> tower::Service<http::Request<B>> for ExtProcService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::BoxBody>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let shared = self.0.clone();
        if req.uri().path() != PROCESS_PATH {
            return Box::pin(async move { Ok(unimplemented_response()) });
        }
        Box::pin(async move {
            let limit = shared.max_message;
            let mut grpc = Grpc::new(RawCodec).apply_max_message_size_config(Some(limit), Some(limit));
            Ok(grpc.streaming(ProcessMethod(shared), req).await)
        })
    }
}

// -- grpc.health.v1 ---------------------------------------------------------------------------------------

fn read_varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// `HealthCheckRequest.service` (field 1); unknown fields are skipped as protobuf requires.
fn health_request_service(message: &[u8]) -> Result<String, Status> {
    let bad = || Status::invalid_argument("malformed HealthCheckRequest");
    let mut buf = message;
    let mut service = String::new();
    while !buf.is_empty() {
        let key = read_varint(&mut buf).ok_or_else(bad)?;
        match key & 7 {
            0 => {
                read_varint(&mut buf).ok_or_else(bad)?;
            }
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                if buf.len() < n {
                    return Err(bad());
                }
                buf = &buf[n..];
            }
            2 => {
                let n = read_varint(&mut buf).ok_or_else(bad)? as usize;
                if buf.len() < n {
                    return Err(bad());
                }
                if key >> 3 == 1 {
                    service = String::from_utf8(buf[..n].to_vec()).map_err(|_| bad())?;
                }
                buf = &buf[n..];
            }
            _ => return Err(bad()),
        }
    }
    Ok(service)
}

fn put_varint(out: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        out.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

fn health_response(status: i32) -> Bytes {
    let mut out = BytesMut::with_capacity(2);
    if status != 0 {
        out.put_u8(0x08);
        put_varint(&mut out, status as u64);
    }
    out.freeze()
}

fn status_of(table: &HashMap<String, i32>, service: &str) -> i32 {
    table.get(service).copied().unwrap_or(HEALTH_SERVICE_UNKNOWN)
}

struct CheckMethod(watch::Receiver<HashMap<String, i32>>);

impl UnaryService<Bytes> for CheckMethod {
    type Response = Bytes;
    type Future = BoxFuture<tonic::Response<Bytes>, Status>;
    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let table = self.0.clone();
        Box::pin(async move {
            let service = health_request_service(request.get_ref())?;
            let status = status_of(&table.borrow(), &service);
            Ok(tonic::Response::new(health_response(status)))
        })
    }
}

struct ListMethod(watch::Receiver<HashMap<String, i32>>);

impl UnaryService<Bytes> for ListMethod {
    type Response = Bytes;
    type Future = BoxFuture<tonic::Response<Bytes>, Status>;
    fn call(&mut self, _request: tonic::Request<Bytes>) -> Self::Future {
        let table = self.0.clone();
        Box::pin(async move {
            // HealthListResponse { map<string, HealthCheckResponse> statuses = 1 }: one entry message per service
            let mut out = BytesMut::new();
            let mut services: Vec<(String, i32)> = table.borrow().iter().map(|(k, v)| (k.clone(), *v)).collect();
            services.sort();
            for (service, status) in services {
                let value = health_response(status);
                let mut entry = BytesMut::new();
                entry.put_u8(0x0a);
                put_varint(&mut entry, service.len() as u64);
                entry.put_slice(service.as_bytes());
                entry.put_u8(0x12);
                put_varint(&mut entry, value.len() as u64);
                entry.put_slice(&value);
                out.put_u8(0x0a);
                put_varint(&mut out, entry.len() as u64);
                out.put_slice(&entry);
            }
            Ok(tonic::Response::new(out.freeze()))
        })
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Reply> + Send + 'static>>;

struct WatchMethod(watch::Receiver<HashMap<String, i32>>);

impl ServerStreamingService<Bytes> for WatchMethod {
    type Response = Bytes;
    type ResponseStream = WatchStream;
    type Future = BoxFuture<tonic::Response<WatchStream>, Status>;
    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let table = self.0.clone();
        Box::pin(async move {
            let service = health_request_service(request.get_ref())?;
            // each change of this service's status, starting with the current one
            let stream = futures_util::stream::unfold((table, None::<i32>), move |(mut table, last)| {
                let service = service.clone();
                async move {
                    loop {
                        let status = status_of(&table.borrow_and_update(), &service);
                        if Some(status) != last {
                            return Some((Ok(health_response(status)), (table, Some(status))));
                        }
                        if table.changed().await.is_err() {
                            return None;
                        }
                    }
                }
            });
            Ok(tonic::Response::new(Box::pin(stream) as WatchStream))
        })
    }
}

#[derive(Clone)]
struct HealthService(watch::Receiver<HashMap<String, i32>>);

impl NamedService for HealthService {
    const NAME: &'static str = "grpc.health.v1.Health";
}

impl<B> tower::Service<http::Request<B>> for HealthService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::BoxBody>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let table = self.0.clone();
        match req.uri().path() {
            "/grpc.health.v1.Health/Check" => Box::pin(async move {
                let mut grpc = Grpc::new(RawCodec).apply_max_message_size_config(Some(4096), Some(4096));
                Ok(grpc.unary(CheckMethod(table), req).await)
            }),
            "/grpc.health.v1.Health/List" => Box::pin(async move {
                let mut grpc = Grpc::new(RawCodec).apply_max_message_size_config(Some(4096), Some(1 << 20));
                Ok(grpc.unary(ListMethod(table), req).await)
            }),
            "/grpc.health.v1.Health/Watch" => Box::pin(async move {
                let mut grpc = Grpc::new(RawCodec).apply_max_message_size_config(Some(4096), Some(4096));
                Ok(grpc.server_streaming(WatchMethod(table), req).await)
            }),
            _ => Box::pin(async move { Ok(unimplemented_response()) }),
        }
    }
}

// -- connections: plaintext or TLS (rustls, certificates replaceable while serving) ------------------------------

enum Conn {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

impl Connected for Conn {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A server configuration from PEM: the certificate chain and key, and with a client CA bundle, mutual TLS
/// (a client certificate that bundle signed is required). ALPN h2, as gRPC needs.
fn tls_config(cert_pem: &[u8], key_pem: &[u8], client_ca_pem: Option<&[u8]>) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::CertificateDer;
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &*cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    if certs.is_empty() {
        return Err("certificate: no PEM certificate".into());
    }
    let key = rustls_pemfile::private_key(&mut &*key_pem)
        .map_err(|e| format!("key: {e}"))?
        .ok_or_else(|| "key: no PEM private key".to_string())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca_pem {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_pemfile::certs(&mut &*ca) {
                roots.add(cert.map_err(|e| format!("client CA: {e}"))?).map_err(|e| format!("client CA: {e}"))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("client CA: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

type PemSet = (Vec<u8>, Vec<u8>, Option<Vec<u8>>);

/// The TLS settings connections are accepted with. `reload` (Python, with the GIL) is asked before each handshake
/// for a replacement (cert, key, client CA) or None, as grpc's dynamic credentials ask: files rotated on disk are
/// served from the next handshake on.
struct Tls {
    config: std::sync::RwLock<Arc<rustls::ServerConfig>>,
    reload: Option<PyObject>,
}

impl Tls {
    fn current(&self) -> Arc<rustls::ServerConfig> {
        if let Some(reload) = &self.reload {
            let replacement: Option<PemSet> = Python::with_gil(|py| {
                reload.call0(py).and_then(|v| v.extract::<Option<PemSet>>(py)).unwrap_or_else(|e| {
                    e.print(py);
                    None
                })
            });
            if let Some((cert, key, ca)) = replacement {
                match tls_config(&cert, &key, ca.as_deref()) {
                    Ok(config) => *self.config.write().unwrap() = config,
                    Err(e) => eprintln!("picker-front: replacement TLS certificate refused: {e}"),
                }
            }
        }
        self.config.read().unwrap().clone()
    }
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

// -- the Python object ------------------------------------------------------------------------------------

fn resolve(host: &str, port: u16) -> PyResult<SocketAddr> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .map_err(|e| PyOSError::new_err(format!("cannot resolve {host:?}: {e}")))?
        .next()
        .ok_or_else(|| PyOSError::new_err(format!("cannot resolve {host:?}")))
}

fn bind(address: SocketAddr, reuse_port: bool) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if address.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    if reuse_port {
        socket.set_reuseport(true)?;
    }
    socket.bind(address)?;
    socket.listen(1024)
}

/// One listening port. `Front(host, port, ...)` binds at once (so a busy port fails here) and serves until
/// `begin_stop()`.
#[pyclass(module = "picker.extproc._front")]
struct Front {
    shared: Arc<Shared>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    stopped: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    #[pyo3(get)]
    port: u16,
}

#[pymethods]
impl Front {
    #[new]
    #[pyo3(signature = (host, port, *, reuse_port=false, max_message=4194304, threads=1, health=true,
                        cert_pem=None, key_pem=None, client_ca_pem=None, reload=None, stream_window=4194304,
                        connection_window=16777216, max_streams=65536))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        host: &str,
        port: u16,
        reuse_port: bool,
        max_message: usize,
        threads: usize,
        health: bool,
        cert_pem: Option<Vec<u8>>,
        key_pem: Option<Vec<u8>>,
        client_ca_pem: Option<Vec<u8>>,
        reload: Option<PyObject>,
        stream_window: u32,
        connection_window: u32,
        max_streams: u32,
    ) -> PyResult<Self> {
        let address = resolve(host, port)?;
        let event_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if event_fd < 0 {
            return Err(PyOSError::new_err(format!("eventfd: {}", std::io::Error::last_os_error())));
        }
        let (health_tx, health_rx) = watch::channel(HashMap::new());
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Vec::new()),
            event_fd,
            streams: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            health: health_tx,
            max_message,
            queued_budget: tokio::sync::Semaphore::new(queued_limit(max_message)),
            queued_limit: queued_limit(max_message),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("picker-front")
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("tokio runtime: {e}")))?;
        let listener = {
            let _guard = runtime.enter();
            bind(address, reuse_port)
                .map_err(|e| PyOSError::new_err(format!("cannot listen on {address}: {e}")))?
        };
        let bound = listener.local_addr().map_err(|e| PyOSError::new_err(e.to_string()))?;

        let builder = Server::builder()
            .initial_stream_window_size(Some(stream_window))
            .initial_connection_window_size(Some(connection_window))
            .max_concurrent_streams(Some(max_streams));
        let tls = match (cert_pem, key_pem) {
            (Some(cert), Some(key)) => {
                let config = tls_config(&cert, &key, client_ca_pem.as_deref())
                    .map_err(|e| PyValueError::new_err(format!("tls: {e}")))?;
                Some(Arc::new(Tls { config: std::sync::RwLock::new(config), reload }))
            }
            (None, None) => {
                if client_ca_pem.is_some() {
                    return Err(PyValueError::new_err("a client CA needs a certificate and key"));
                }
                None
            }
            _ => return Err(PyValueError::new_err("cert_pem and key_pem go together")),
        };
        let mut builder = builder;
        let router = builder.add_service(ExtProcService(shared.clone()));
        let router = if health { router.add_service(HealthService(health_rx)) } else { router };

        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (stopped_tx, stopped_rx) = std::sync::mpsc::channel::<()>();
        // The accept loop owns the listener and drops it at `begin_stop`, so the port refuses new connections at
        // once (as grpc.aio's stop does); the incoming stream then ends, and tonic sends every connection GOAWAY and
        // waits for the calls in progress.
        let (conn_tx, conn_rx) = mpsc::channel::<std::io::Result<Conn>>(64);
        runtime.spawn(async move {
            let mut stop_rx = stop_rx;
            loop {
                tokio::select! {
                    _ = &mut stop_rx => break,
                    accepted = listener.accept() => {
                        let stream = match accepted {
                            Ok((stream, _)) => stream,
                            Err(_) => {
                                // out of descriptors, say: do not spin
                                tokio::time::sleep(Duration::from_millis(10)).await;
                                continue;
                            }
                        };
                        let _ = stream.set_nodelay(true);
                        match &tls {
                            None => {
                                if conn_tx.send(Ok(Conn::Plain(stream))).await.is_err() {
                                    break;
                                }
                            }
                            Some(tls) => {
                                // the handshake (and asking Python for a rotated certificate) off the accept loop
                                let (tls, conn_tx) = (tls.clone(), conn_tx.clone());
                                tokio::spawn(async move {
                                    let Ok(config) = tokio::task::spawn_blocking(move || tls.current()).await else {
                                        return;
                                    };
                                    let acceptor = tokio_rustls::TlsAcceptor::from(config);
                                    if let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                        let _ = conn_tx.send(Ok(Conn::Tls(Box::new(stream)))).await;
                                    }
                                });
                            }
                        }
                    }
                }
            }
        });
        let server_shared = shared.clone();
        runtime.spawn(async move {
            let incoming = ReceiverStream::new(conn_rx);
            let _ = router.serve_with_incoming_shutdown(incoming, std::future::pending::<()>()).await;
            let _ = stopped_tx.send(());
            server_shared.push(0, STOPPED, None);
        });
        Ok(Front {
            shared,
            runtime: Mutex::new(Some(runtime)),
            stop: Mutex::new(Some(stop_tx)),
            stopped: Mutex::new(Some(stopped_rx)),
            port: bound.port(),
        })
    }

    /// The eventfd that turns readable when events wait (for `loop.add_reader`).
    fn fileno(&self) -> i32 {
        self.shared.event_fd
    }

    /// Every waiting event, oldest first: `(stream_id, kind, payload)` with kind 0 a message (payload its bytes),
    /// 1 the client's half-close and 2 the call's end (payload None).
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut counter = 0u64;
        unsafe { libc::read(self.shared.event_fd, &mut counter as *mut u64 as *mut libc::c_void, 8) };
        let events = std::mem::take(&mut *self.shared.inbox.lock().unwrap());
        let drained: usize = events
            .iter()
            .filter(|(_, kind, _)| *kind == MESSAGE)
            .map(|(_, _, payload)| payload.as_ref().map_or(0, |b| b.len()).clamp(1, self.shared.queued_limit))
            .sum();
        self.shared.queued_budget.add_permits(drained);
        let list = PyList::empty(py);
        for (id, kind, payload) in events {
            let payload: PyObject = match payload {
                Some(bytes) => PyBytes::new(py, &bytes).into_any().unbind(),
                None => py.None(),
            };
            list.append(PyTuple::new(py, [id.into_pyobject(py)?.into_any().unbind(), kind.into_pyobject(py)?.into_any().unbind(), payload])?)?;
        }
        Ok(list)
    }

    /// Queue answers on a stream; with `finish` the call then ends with OK. False: the call is already over.
    #[pyo3(signature = (stream_id, payloads, finish=false))]
    fn send(&self, stream_id: u64, payloads: Vec<Bound<'_, PyBytes>>, finish: bool) -> bool {
        let mut streams = self.shared.streams.lock().unwrap();
        let Some(tx) = streams.get(&stream_id) else { return false };
        for payload in &payloads {
            if tx.send(Ok(Bytes::copy_from_slice(payload.as_bytes()))).is_err() {
                streams.remove(&stream_id);
                return false;
            }
        }
        if finish {
            streams.remove(&stream_id);
        }
        true
    }

    /// End a call with a gRPC status (after the answers already queued).
    fn abort(&self, stream_id: u64, code: i32, message: &str) -> bool {
        let Some(tx) = self.shared.streams.lock().unwrap().remove(&stream_id) else { return false };
        tx.send(Err(Status::new(Code::from(code), message))).is_ok()
    }

    /// The health table: service name → grpc.health.v1 status (any other name is SERVICE_UNKNOWN).
    fn set_health(&self, statuses: HashMap<String, i32>) {
        self.shared.health.send_replace(statuses);
    }

    /// Calls not yet over.
    fn active(&self) -> usize {
        self.shared.streams.lock().unwrap().len()
    }

    /// Stop accepting: connections get GOAWAY; calls in progress go on.
    fn begin_stop(&self) {
        if let Some(stop) = self.stop.lock().unwrap().take() {
            let _ = stop.send(());
        }
    }

    /// Wait (without the GIL) up to `timeout_s` for every connection to close after `begin_stop`.
    fn wait_stopped(&self, py: Python<'_>, timeout_s: f64) -> bool {
        let Some(rx) = self.stopped.lock().unwrap().take() else { return true };
        let timeout = Duration::from_secs_f64(timeout_s.max(0.0));
        let (rx, timed_out) = py.allow_threads(move || {
            let timed_out = matches!(rx.recv_timeout(timeout), Err(std::sync::mpsc::RecvTimeoutError::Timeout));
            (rx, timed_out)
        });
        if timed_out {
            *self.stopped.lock().unwrap() = Some(rx);
        }
        !timed_out
    }

    /// End every call still open with UNAVAILABLE (sent by the front's thread, which goes on until `terminate`).
    /// Returns how many there were.
    fn abort_all(&self) -> usize {
        let open: Vec<_> = self.shared.streams.lock().unwrap().drain().collect();
        for (_, tx) in &open {
            let _ = tx.send(Err(Status::unavailable("picker is shutting down")));
        }
        open.len()
    }

    /// Stop the front's threads without waiting for them (nothing here blocks the caller). Spent afterwards.
    fn terminate(&self) {
        self.begin_stop();
        self.abort_all();
        if let Some(runtime) = self.runtime.lock().unwrap().take() {
            runtime.shutdown_background();
        }
    }
}

#[pymodule]
fn _front(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Front>()?;
    m.add("MESSAGE", MESSAGE)?;
    m.add("END", END)?;
    m.add("GONE", GONE)?;
    m.add("STOPPED", STOPPED)?;
    Ok(())
}
