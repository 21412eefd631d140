//! The HTTP endpoint on a hostile network, in-process: a client trickling its request head is cut
//! off within the header timeout, 2,000 idle connections do not stop `/livez` answering, connections
//! over the cap are closed at once, only GET/HEAD are served, and shutdown stops accepting.

use kafka_backfill::shutdown::CancellationToken;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use kafka_backfill::service::http::{spawn, Limits};
use kafka_backfill::service::runtime::Runtimes;

/// A status listener with these limits: its address, its stop, its process's metrics.
fn server(
    max_connections: usize,
    header_timeout: Duration,
) -> (SocketAddr, CancellationToken, Runtimes) {
    let stop = CancellationToken::new();
    let runtimes = Runtimes::default();
    let addr = spawn(
        "127.0.0.1:0",
        kafka_backfill::service::http::status_router(
            kafka_backfill::service::job::new_board(),
            runtimes.clone(),
        ),
        Limits {
            max_connections,
            header_timeout,
            connection_timeout: header_timeout + Duration::from_secs(5),
        },
        runtimes.metrics().http_rejected.clone(),
        stop.clone(),
    )
    .unwrap();
    (addr, stop, runtimes)
}

/// One request on a fresh connection: (status code, whole response).
fn request(addr: SocketAddr, raw: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    request(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
}

#[test]
fn a_slow_drip_client_is_cut_off_within_the_header_timeout() {
    let (addr, _stop, _) = server(64, Duration::from_secs(1));
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let started = Instant::now();
    let head = b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut closed_at = None;
    for &b in head.iter() {
        if s.write_all(&[b]).is_err() {
            closed_at = Some(started.elapsed());
            break;
        }
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(0) => {
                closed_at = Some(started.elapsed());
                break;
            }
            Ok(_) => {
                // An answer (408) and then the close.
                closed_at = Some(started.elapsed());
                break;
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => {
                closed_at = Some(started.elapsed());
                break;
            }
        }
    }
    let closed_at = closed_at.expect("the server never cut the trickling client off");
    assert!(
        closed_at < Duration::from_secs(3),
        "cut off after {closed_at:?}, header timeout 1 s"
    );
}

#[test]
fn two_thousand_idle_connections_do_not_stop_livez() {
    let (addr, _stop, _) = server(4096, Duration::from_secs(5));
    let idle: Vec<TcpStream> = (0..2000)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let started = Instant::now();
    let (code, body) = get(addr, "/livez");
    assert_eq!(code, 200, "{body}");
    assert!(body.ends_with("ok\n"), "{body}");
    // Well under the 5 s header timeout: /livez did not wait for idle connections to be cut.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "/livez took {:?} beside 2,000 idle connections",
        started.elapsed()
    );
    drop(idle);
}

#[test]
fn connections_over_the_cap_are_closed_at_once() {
    let (addr, _stop, runtimes) = server(8, Duration::from_secs(5));
    let before = runtimes.metrics().http_rejected.get();
    let held: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // Wait until the server has taken all eight (observed: the ninth is refused).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 16];
        let started = Instant::now();
        if let Ok(0) = s.read(&mut buf) {
            assert!(started.elapsed() < Duration::from_secs(1), "closed at once");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ninth connection was never refused"
        );
    }
    assert!(runtimes.metrics().http_rejected.get() > before);
    drop(held);
    // Once they are gone, requests are served again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(addr, "/livez").0 != 200 {
        assert!(Instant::now() < deadline, "never served again");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn only_get_and_head_are_served_and_shutdown_stops_accepting() {
    let (addr, stop, _) = server(64, Duration::from_secs(5));
    assert_eq!(get(addr, "/livez").0, 200);
    assert_eq!(get(addr, "/nope").0, 404);
    let (code, _) = request(
        addr,
        "POST /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(code, 405);
    let (code, text) = request(
        addr,
        "HEAD /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(code, 200);
    assert!(text.ends_with("\r\n\r\n"), "HEAD has no body: {text:?}");
    let (code, text) = get(addr, "/metrics");
    assert_eq!(code, 200);
    assert!(text.contains("kafka_backfill_http_connections_rejected_total"));
    stop.cancel();
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(addr).is_ok() {
        assert!(Instant::now() < deadline, "still accepting after shutdown");
        std::thread::sleep(Duration::from_millis(50));
    }
}
