//! The upstream connection's IO, sized for plain HTTP.
//!
//! hyper-rustls' `MaybeHttpsStream` holds a rustls client connection
//! inline: about 1.1 KiB, against 40 bytes for the plain TCP stream. A
//! pooled HTTP/1 connection keeps its IO for its life, so every held
//! stream to a plain-HTTP upstream paid that kilobyte. Here the TLS stream
//! is boxed: an `https` connection pays one pointer more, a plain one
//! nothing.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::TryFutureExt;
use futures_util::future::MapOk;
use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

use super::proxy::UpstreamConnector;
use tower_llm_failover::BoxError;

type Https = MaybeHttpsStream<TokioIo<TcpStream>>;

/// One upstream connection: plain TCP inline, TLS boxed.
#[derive(Debug)]
pub(crate) enum UpstreamIo {
    Plain(TokioIo<TcpStream>),
    Tls(Box<Https>),
}

impl From<Https> for UpstreamIo {
    fn from(stream: Https) -> Self {
        match stream {
            MaybeHttpsStream::Http(plain) => Self::Plain(plain),
            tls @ MaybeHttpsStream::Https(_) => Self::Tls(Box::new(tls)),
        }
    }
}

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        match self {
            Self::Plain(plain) => plain.connected(),
            // ALPN's answer (HTTP/2 or not) is the TLS stream's to say.
            Self::Tls(tls) => tls.connected(),
        }
    }
}

// Both variants are `Unpin` (a TCP stream, a box): no pin projection.
impl Read for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(plain) => Pin::new(plain).poll_read(cx, buf),
            Self::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
        }
    }
}

impl Write for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(plain) => Pin::new(plain).poll_write(cx, buf),
            Self::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(plain) => Pin::new(plain).poll_write_vectored(cx, bufs),
            Self::Tls(tls) => Pin::new(&mut **tls).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(plain) => plain.is_write_vectored(),
            Self::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(plain) => Pin::new(plain).poll_flush(cx),
            Self::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(plain) => Pin::new(plain).poll_shutdown(cx),
            Self::Tls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
        }
    }
}

/// hyper-rustls' connector, answering [`UpstreamIo`].
#[derive(Debug, Clone)]
pub(crate) struct CompactConnector(pub(crate) HttpsConnector<UpstreamConnector>);

impl Service<Uri> for CompactConnector {
    type Response = UpstreamIo;
    type Error = BoxError;
    type Future =
        MapOk<<HttpsConnector<UpstreamConnector> as Service<Uri>>::Future, fn(Https) -> UpstreamIo>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        self.0
            .call(dst)
            .map_ok(UpstreamIo::from as fn(Https) -> UpstreamIo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_connection_does_not_carry_a_tls_stream_inline() {
        assert!(
            std::mem::size_of::<UpstreamIo>() <= std::mem::size_of::<TokioIo<TcpStream>>() + 16
        );
        assert!(
            std::mem::size_of::<Https>() > 512,
            "the reason for the box is gone"
        );
    }
}
