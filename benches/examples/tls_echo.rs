//! TLS with rustls over `vt::net`: a server and its clients, each connection a fiber running
//! blocking-style rustls (`StreamOwned` over a `vt::net::TcpStream`), with a self-signed
//! certificate made at start-up with rcgen (`arch/guide.md`, "With rustls, tungstenite, httparse").
//!
//! rustls runs with its `ring` provider (the default, aws-lc-rs, needs cmake to build).
//! Run: `cargo run --example tls_echo`; `benches/tests/examples.rs` runs it as a test.

use std::error::Error;
use std::io::{self, BufRead, BufReader, Write};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection, StreamOwned};
use virtual_threads as vt;

fn main() -> Result<(), Box<dyn Error>> {
    demo(100)?;
    println!("tls_echo: 100 TLS connections, each a fiber on both ends, echoed a line");
    Ok(())
}

/// A TLS server for `clients` connections, and as many client fibers, each sending a line.
pub fn demo(clients: usize) -> Result<(), Box<dyn Error>> {
    let (server_config, client_config) = configs()?;
    let listener = vt::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = vt::spawn(move || -> io::Result<()> {
        for conn in listener.incoming().take(clients) {
            let conn = conn?;
            let config = server_config.clone();
            vt::spawn(move || -> io::Result<()> {
                // The handshake's and the records' reads and writes park this fiber.
                let tls = ServerConnection::new(config).map_err(io::Error::other)?;
                let mut stream = StreamOwned::new(tls, conn);
                let mut line = String::new();
                BufReader::new(&mut stream).read_line(&mut line)?;
                stream.write_all(line.to_uppercase().as_bytes())?;
                stream.conn.send_close_notify();
                stream.flush()
            });
        }
        Ok(())
    });
    let fibers: Vec<_> = (0..clients)
        .map(|i| {
            let config = client_config.clone();
            vt::spawn(move || -> io::Result<String> {
                let name = ServerName::try_from("localhost").expect("a valid name");
                let tls = ClientConnection::new(config, name).map_err(io::Error::other)?;
                let mut stream = StreamOwned::new(tls, vt::net::TcpStream::connect(addr)?);
                stream.write_all(format!("hello {i} over tls\n").as_bytes())?;
                let mut reply = String::new();
                BufReader::new(&mut stream).read_line(&mut reply)?;
                Ok(reply)
            })
        })
        .collect();
    for (i, fiber) in fibers.into_iter().enumerate() {
        assert_eq!(fiber.join().expect("client fiber")?, format!("HELLO {i} OVER TLS\n"));
    }
    server.join().expect("server fiber")?;
    Ok(())
}

/// The server's configuration with a self-signed certificate for "localhost", made now, and a
/// client's that trusts that certificate alone.
fn configs() -> Result<(Arc<ServerConfig>, Arc<ClientConfig>), Box<dyn Error>> {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(["localhost".to_string()])?;
    let cert: CertificateDer<'static> = cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(signing_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)?;
    let mut roots = RootCertStore::empty();
    roots.add(cert)?;
    let client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok((Arc::new(server), Arc::new(client)))
}
