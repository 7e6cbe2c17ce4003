//! A store server is chosen by whoever writes the store URL or endpoint (in the operator,
//! any tenant): no answer of it may cost unbounded memory. A hostile S3 server on
//! 127.0.0.1 answers a listing with an endless page, an object read with a huge error
//! body, and an error with a forged `Content-Length` of a terabyte.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use tidemark_store::{ClusterStore, S3Credentials, StoreOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A request's head, up to its blank line (`None`: the connection ended first).
async fn request_head(conn: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(head)
}

/// Serves every connection by `answer(request line)`: the head to send, then how many
/// filler bytes follow it.
async fn hostile_server(answer: fn(&str) -> (String, usize)) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Some(head) = request_head(&mut conn).await else {
                    return;
                };
                let text = String::from_utf8_lossy(&head);
                let (reply, filler) = answer(text.lines().next().unwrap_or_default());
                if conn.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'x'; 64 * 1024];
                let mut left = filler;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if conn.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
            });
        }
    });
    url
}

fn open(endpoint: &str) -> ClusterStore {
    let options = StoreOptions {
        endpoint: Some(endpoint.to_owned()),
        credentials: Some(S3Credentials {
            access_key_id: "k".into(),
            secret_access_key: "s".into(),
            session_token: None,
        }),
        retry_timeout: Some(std::time::Duration::from_secs(2)),
        ..Default::default()
    };
    ClusterStore::open("s3://bucket", "c", &options).unwrap()
}

#[tokio::test]
async fn a_listing_page_over_the_limit_fails() {
    // 20 MiB announced and sent (a page of 1000 keys is well under 1 MiB).
    let url = hostile_server(|_| {
        let n = 20 << 20;
        (
            format!("HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"),
            n,
        )
    })
    .await;
    let store = open(&url);
    let e = store
        .object_store()
        .list(None)
        .try_collect::<Vec<_>>()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("larger than 16777216 bytes"),
        "{}",
        &e[..e.len().min(2000)]
    );
}

#[tokio::test]
async fn an_error_body_is_cut() {
    // A 400 with 8 MiB of body: object_store puts the body into its error message.
    let url = hostile_server(|_| {
        let n = 8 << 20;
        (
            format!("HTTP/1.1 400 Bad Request\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"),
            n,
        )
    })
    .await;
    let store = open(&url);
    let e = store
        .object_store()
        .get(&Path::from("x"))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("xxxx"), "{}", &e[..e.len().min(2000)]);
    assert!(
        e.len() < 2 * tidemark_store::bounded::MAX_ERROR_BODY as usize,
        "an error of {} bytes",
        e.len()
    );
}

#[tokio::test]
async fn a_forged_length_reserves_nothing() {
    // A terabyte announced, 1 MiB sent (in several reads): sizing a buffer by the
    // announcement would abort the process.
    let url = hostile_server(|_| {
        (
            "HTTP/1.1 400 Bad Request\r\nContent-Length: 1099511627776\r\nConnection: close\r\n\r\n"
                .to_owned(),
            1 << 20,
        )
    })
    .await;
    let store = open(&url);
    let e = store
        .object_store()
        .get(&Path::from("x"))
        .await
        .unwrap_err()
        .to_string();
    assert!(!e.is_empty());
    let url = hostile_server(|_| {
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\nConnection: close\r\n\r\n"
                .to_owned(),
            1 << 20,
        )
    })
    .await;
    let store = open(&url);
    assert!(
        store
            .object_store()
            .list(None)
            .try_collect::<Vec<_>>()
            .await
            .is_err()
    );
}

/// Issue 42: the operator's denied ranges hold on every connection. A server on loopback,
/// reached by a name (`localhost`), is never connected to when loopback is denied — the
/// request fails naming the range — though the same server answers without the ranges;
/// an endpoint written as a denied address is refused when the store is opened.
#[tokio::test]
async fn denied_addresses_are_never_connected_to() {
    // Every request it is sent is counted: none may arrive while loopback is denied.
    static SERVED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let url = hostile_server(|_| {
        SERVED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        (
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".into(),
            0,
        )
    })
    .await;
    let port = url.rsplit(':').next().unwrap().to_owned();
    let served = &SERVED;
    let denied = tidemark_store::deny::parse_cidrs("127.0.0.0/8,::1").unwrap();
    let options = |endpoint: String, denied: Vec<tidemark_store::deny::Cidr>| StoreOptions {
        endpoint: Some(endpoint),
        credentials: Some(S3Credentials {
            access_key_id: "k".into(),
            secret_access_key: "s".into(),
            session_token: None,
        }),
        retry_timeout: Some(std::time::Duration::from_secs(2)),
        denied_endpoints: denied,
        ..Default::default()
    };
    let by_name = format!("http://localhost:{port}");
    let store = ClusterStore::open(
        "s3://bucket",
        "c",
        &options(by_name.clone(), denied.clone()),
    )
    .unwrap();
    let e = store
        .read(&Path::from("x"))
        .await
        .expect_err("a denied address was reached");
    let said = format!("{e:?}");
    assert!(said.contains("--deny-endpoints"), "{said}");
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 0);
    // The same server, not denied: reached (a 404 is "not there").
    let store = ClusterStore::open("s3://bucket", "c", &options(by_name, Vec::new())).unwrap();
    assert!(store.read(&Path::from("x")).await.unwrap().is_none());
    assert!(served.load(std::sync::atomic::Ordering::SeqCst) > 0);
    // Written as an address: refused at once.
    let e = ClusterStore::open(
        "s3://bucket",
        "c",
        &options(format!("http://127.0.0.1:{port}"), denied),
    )
    .expect_err("a denied literal was accepted");
    assert!(e.to_string().contains("127.0.0.1"), "{e}");
}

/// Serves every object read a body of `len` bytes (or the range asked), `chunk` bytes at a
/// time with `pause` between them (and `wait` before its head); a connection is dropped
/// once it has sent `cut` bytes of body.
async fn paced_server(
    len: usize,
    chunk: usize,
    pause: std::time::Duration,
    wait: std::time::Duration,
    cut: usize,
) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Some(head) = request_head(&mut conn).await else {
                    return;
                };
                tokio::time::sleep(wait).await;
                // A retry asks for the rest: `Range: bytes=FROM-TO`.
                let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let range = text.lines().find_map(|l| {
                    let (from, to) = l.strip_prefix("range: bytes=")?.trim().split_once('-')?;
                    Some((from.parse::<usize>().ok()?, to.parse::<usize>().ok()?))
                });
                let common = "ETag: \"e\"\r\nLast-Modified: Mon, 30 Nov 2026 00:00:00 GMT\r\nConnection: close";
                let (reply, mut left) = match range {
                    Some((from, to)) => (
                        format!(
                            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {from}-{to}/{len}\r\n{common}\r\n\r\n",
                            to + 1 - from
                        ),
                        to + 1 - from,
                    ),
                    None => (
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n{common}\r\n\r\n"),
                        len,
                    ),
                };
                if conn.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                let mut sent = 0;
                while left > 0 && sent < cut {
                    let n = left.min(chunk);
                    if conn.write_all(&vec![b'x'; n]).await.is_err() {
                        return;
                    }
                    left -= n;
                    sent += n;
                    tokio::time::sleep(pause).await;
                }
            });
        }
    });
    url
}

fn open_timed(endpoint: &str, request: std::time::Duration) -> ClusterStore {
    let options = StoreOptions {
        endpoint: Some(endpoint.to_owned()),
        credentials: Some(S3Credentials {
            access_key_id: "k".into(),
            secret_access_key: "s".into(),
            session_token: None,
        }),
        retry_timeout: Some(std::time::Duration::from_secs(2)),
        request_timeout: Some(request),
        ..Default::default()
    };
    ClusterStore::open("s3://bucket", "c", &options).unwrap()
}

/// Issue 47's 2 GiB dump: a restore streams a payload into a database's load for as long
/// as the load takes. A deadline on the whole read (object_store's 30 s, and its retries'
/// 60 s) cut every payload that takes longer to use, mid-statement. An object read's body
/// has no deadline: here it arrives over about 4 s while its reader also holds it back
/// for 3 s, against a request deadline of 1 s and retries for 2 s — and arrives whole.
#[tokio::test]
async fn an_object_read_longer_than_any_request_deadline_arrives_whole() {
    use futures::StreamExt;
    let len = 1 << 20;
    let url = paced_server(
        len,
        128 << 10,
        std::time::Duration::from_millis(500),
        std::time::Duration::ZERO,
        usize::MAX,
    )
    .await;
    let store = open_timed(&url, std::time::Duration::from_secs(1));
    let started = std::time::Instant::now();
    let mut body = store
        .object_store()
        .get(&Path::from("payload"))
        .await
        .unwrap()
        .into_stream();
    let mut got = 0;
    let mut first = true;
    while let Some(chunk) = body.next().await {
        got += chunk.unwrap().len();
        if first {
            // A slow sink: nothing asked of the server for a while.
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            first = false;
        }
    }
    assert_eq!(got, len);
    assert!(started.elapsed() > std::time::Duration::from_secs(3));
}

/// What the missing deadline may not allow: a server that trickles an object's body (a
/// byte every 200 ms), answers no head, or stops an error's body after a byte, fails the
/// read — as a timeout, retried by object_store — instead of holding it for ever.
#[tokio::test]
async fn a_server_that_trickles_or_stalls_fails_the_read() {
    use futures::StreamExt;
    let trickle = paced_server(
        1 << 20,
        1,
        std::time::Duration::from_millis(200),
        std::time::Duration::ZERO,
        usize::MAX,
    )
    .await;
    let stall = paced_server(
        16,
        16,
        std::time::Duration::ZERO,
        std::time::Duration::from_secs(3600),
        usize::MAX,
    )
    .await;
    // An error whose body stops after its first byte (object_store reads an error's body
    // whole, for its message).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stalled_error = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                if request_head(&mut conn).await.is_some() {
                    let _ = conn
                        .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 1000\r\n\r\nx")
                        .await;
                    tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                }
            });
        }
    });
    for url in [trickle, stall, stalled_error] {
        let store = open_timed(&url, std::time::Duration::from_secs(1));
        let read = async {
            let mut body = store
                .object_store()
                .get(&Path::from("payload"))
                .await?
                .into_stream();
            while let Some(chunk) = body.next().await {
                chunk?;
            }
            Ok::<(), object_store::Error>(())
        };
        let e = tokio::time::timeout(std::time::Duration::from_secs(60), read)
            .await
            .expect("the read was held for a minute")
            .expect_err("a trickle or a stall was read as an object");
        let said = e.to_string();
        assert!(said.contains("the store's server is too slow"), "{said}");
    }
}

/// A long read whose connection drops after object_store's retries have run out (2 s
/// here, 60 s in use): a restore streaming a payload for an hour would fail on the first
/// dropped connection. The read resumes from the byte it reached — the server here drops
/// every connection after 128 KiB, over about 6 s — and the object arrives whole, its
/// checksum right.
#[tokio::test]
async fn a_long_read_resumes_where_its_connection_dropped() {
    use sha2::Digest;
    let len = 512 << 10;
    let url = paced_server(
        len,
        64 << 10,
        std::time::Duration::from_millis(600),
        std::time::Duration::ZERO,
        128 << 10,
    )
    .await;
    let store = open_timed(&url, std::time::Duration::from_secs(5));
    let sha = hex::encode(sha2::Sha256::digest(vec![b'x'; len]));
    let mut sink: Vec<u8> = Vec::new();
    tidemark_store::transfer::copy_verified(
        &store,
        &Path::from("c/payload"),
        len as u64,
        Some(&sha),
        tidemark_store::format::Form::default(),
        &mut sink,
        &tidemark_store::NoProgress,
    )
    .await
    .unwrap();
    assert_eq!(sink.len(), len);
}
