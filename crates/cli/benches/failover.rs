//! How soon after a failover the binlog archive has the new primary's first file (issue 27):
//! a primary and its GTID replica behind a TCP proxy (a Service that follows the primary),
//! `tidemark archive-binlogs --from-server` watching through it every second; the primary
//! is killed, the replica promoted and the proxy moved to it, the new primary writes and
//! closes a binlog file; the time until the archive holds that file, on a new timeline.
//! `cargo bench -p tidemark --bench failover` (TIDEMARK_BENCH_FAILOVER_ROUNDS, default 3).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_store::testkit::{MariaDb, SeaweedFs};

/// A TCP proxy on 127.0.0.1 to a port that can be moved; moving it cuts every connection.
struct Proxy {
    port: u16,
    target: Arc<Mutex<u16>>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = Arc::new(Mutex::new(target));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (t, o) = (target.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let to = *t.lock().unwrap();
                let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                o.lock()
                    .unwrap()
                    .extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                for (mut from, mut into) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || into.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = into.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, target, open }
    }

    fn move_to(&self, port: u16) {
        *self.target.lock().unwrap() = port;
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn round(s3: &SeaweedFs, cluster: &str) -> Duration {
    let mut primary = MariaDb::start_replicating(1);
    let replica = MariaDb::start_replicating(2);
    replica.replicate_from(&primary);
    primary.sql(
        "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT AUTO_INCREMENT PRIMARY KEY, v INT); \
         CREATE USER 'arch'@'%' IDENTIFIED BY 'arch-pw'; GRANT ALL ON *.* TO 'arch'@'%'; \
         CREATE USER 'arch'@'localhost' IDENTIFIED BY 'arch-pw'; GRANT ALL ON *.* TO 'arch'@'localhost'",
    );
    let proxy = Proxy::start(primary.port);
    let options = replica.scratch().join("arch.cnf");
    std::fs::write(&options, "[client]\nuser=arch\npassword=arch-pw\n").unwrap();
    let spool = replica.scratch().join("spool");
    let mut archiver = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .envs(s3.env())
        .args([
            "archive-binlogs",
            "--store",
            &s3.url(),
            "--cluster",
            cluster,
        ])
        .args([
            "--endpoint",
            &s3.endpoint,
            "--from-server",
            "--interval",
            "1s",
        ])
        .args(["--spool", spool.to_str().unwrap(), "--"])
        .arg(format!("--defaults-extra-file={}", options.display()))
        .args(["--host=127.0.0.1", &format!("--port={}", proxy.port)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let timelines = || -> Vec<serde_json::Value> {
        let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .envs(s3.env())
            .args(["ls", "--store", &s3.url(), "--cluster", cluster])
            .args(["--endpoint", &s3.endpoint, "--output", "json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["archive"]["timelines"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    primary.sql("INSERT INTO shop.orders (v) VALUES (1); FLUSH BINARY LOGS");
    let deadline = Instant::now() + Duration::from_secs(60);
    while timelines()
        .first()
        .is_none_or(|t| t["segments"].as_u64().unwrap_or(0) == 0)
    {
        assert!(
            Instant::now() < deadline,
            "nothing archived from the primary"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    replica.wait_caught_up(&primary);
    // The failover.
    primary.kill();
    replica.promote();
    proxy.move_to(replica.port);
    let t0 = Instant::now();
    replica.sql("INSERT INTO shop.orders (v) VALUES (2); FLUSH BINARY LOGS");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let t = timelines();
        if t.get(1)
            .is_some_and(|t| t["segments"].as_u64().unwrap_or(0) > 0)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new primary's binlog never arrived: {t:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = t0.elapsed();
    let _ = archiver.kill();
    let _ = archiver.wait();
    took
}

fn main() {
    let rounds: usize = std::env::var("TIDEMARK_BENCH_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let s3 = SeaweedFs::start();
    let mut took: Vec<Duration> = (0..rounds)
        .map(|r| round(&s3, &format!("failover-{r}")))
        .collect();
    took.sort();
    println!(
        "\nfailover to the archive's first segment from the new primary (archiver interval 1 s)"
    );
    for (r, t) in took.iter().enumerate() {
        println!("round {r}: {:.2} s", t.as_secs_f64());
    }
    println!("median  {:.2} s", took[took.len() / 2].as_secs_f64());
}
