//! A WebSocket echo with tungstenite over `vt::net`: tungstenite's blocking API, each
//! connection a fiber (`arch/guide.md`, "With rustls, tungstenite, httparse").
//!
//! Run: `cargo run --example ws_echo`; `benches/tests/examples.rs` runs it as a test.

use std::error::Error;
use std::io;

use tungstenite::Message;
use virtual_threads as vt;

fn main() -> Result<(), Box<dyn Error>> {
    demo(100, 10)?;
    println!("ws_echo: 100 WebSocket clients, each a fiber, had 10 messages echoed");
    Ok(())
}

/// Echoes every text or binary message until the client closes.
fn echo(conn: vt::net::TcpStream) -> tungstenite::Result<()> {
    let mut ws = tungstenite::accept(conn).map_err(|e| io::Error::other(e.to_string()))?;
    loop {
        match ws.read()? {
            msg @ (Message::Text(_) | Message::Binary(_)) => ws.send(msg)?, // parks while blocked
            Message::Close(_) => return Ok(()), // tungstenite answers the close itself
            _ => {}
        }
    }
}

/// A WebSocket echo server for `clients` connections, and as many client fibers, each sending
/// `messages` messages and checking the echoes.
pub fn demo(clients: usize, messages: usize) -> Result<(), Box<dyn Error>> {
    let listener = vt::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = vt::spawn(move || -> io::Result<()> {
        for conn in listener.incoming().take(clients) {
            let conn = conn?;
            vt::spawn(move || {
                if let Err(e) = echo(conn) {
                    eprintln!("ws_echo: connection: {e}");
                }
            });
        }
        Ok(())
    });
    let fibers: Vec<_> = (0..clients)
        .map(|c| {
            vt::spawn(move || -> Result<(), String> {
                let conn = vt::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
                let (mut ws, _) =
                    tungstenite::client(format!("ws://{addr}/echo"), conn).map_err(|e| e.to_string())?;
                for m in 0..messages {
                    let text = format!("client {c} message {m}");
                    ws.send(Message::text(text.clone())).map_err(|e| e.to_string())?;
                    match ws.read().map_err(|e| e.to_string())? {
                        Message::Text(back) if back.as_str() == text => {}
                        other => return Err(format!("client {c}: sent {text:?}, got {other:?}")),
                    }
                }
                ws.close(None).map_err(|e| e.to_string())?;
                // Until the server's close frame comes back (then tungstenite reports the end).
                while ws.read().is_ok() {}
                Ok(())
            })
        })
        .collect();
    for fiber in fibers {
        fiber.join().expect("client fiber")?;
    }
    server.join().expect("server fiber")?;
    Ok(())
}
