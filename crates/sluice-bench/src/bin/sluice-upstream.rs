//! `sluice-upstream`: the smallest HTTP/1.1 upstream a gateway benchmark needs. Every request
//! gets `200 ok` (a 3-byte body, `Content-Length` framed); a request body is read and dropped.
//! bench/gateway-latency.sh sends the same `GET` to it directly and through `sluice-gateway`,
//! so the upstream's own cost is in both figures and the difference is the gateway's.

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A minimal HTTP/1.1 upstream answering `200 ok` to everything.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Listen address.
    #[arg(long)]
    listen: SocketAddr,
}

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // Drain a body so the connection stays usable; its bytes are not looked at.
    let _ = req.into_body().collect().await;
    Ok(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
}

/// One thread: at a benchmark's moderate rates the upstream should cost little and the same
/// for every request, direct or through a gateway.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors, mostly: back off instead of spinning.
                eprintln!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), hyper::service::service_fn(answer))
                .await;
        });
    }
}
