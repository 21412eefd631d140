//! The status page at `/` (`src/service/http.rs`, `STATUS_PAGE`) in a real headless Chromium
//! (Debian's `chromium`, installed by `scripts/deps.sh`) against a running job: the page loads, shows
//! the job, its workers' phases and one grid square per vnode, refreshes itself, and follows the job
//! into the streaming phase. A screenshot is kept at `target/artifacts/status-page.png`.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::{free_port, http_get, serial, Fixture};

/// Chromium's DOM of `url` once the page's script has run for `virtual_ms` of page time (the page
/// refreshes every second; network reads are waited for).
fn dom(url: &str, virtual_ms: u64) -> String {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            &format!("--virtual-time-budget={virtual_ms}"),
            "--dump-dom",
            url,
        ])
        .output()
        .expect("Debian's chromium (scripts/deps.sh installs it)");
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// How many times the page says it refreshed.
fn refreshes(dom: &str) -> u64 {
    let at =
        dom.find("id=\"refreshes\">").expect("the refresh counter") + "id=\"refreshes\">".len();
    dom[at..].split('<').next().unwrap().parse().unwrap()
}

#[test]
fn the_status_page_shows_the_phases_and_the_vnode_grid_in_a_real_browser_and_updates() {
    let _g = serial();
    let f = Fixture::new("page", 1, "max_rows_per_second = 4000");
    f.produce(&["--partitions", "2", "--rows", "4000", "--changes", "8000"]);
    let http = format!("127.0.0.1:{}", free_port());
    let mut run = f.spawn_run_serving("a", &[], &http);
    run.wait_for("partitions assigned", Duration::from_secs(60));
    let url = format!("http://{http}/");
    let (code, page) = http_get(&url);
    assert_eq!(code, 200);
    assert!(
        !page.contains("src=\"http") && !page.contains("href=\"http"),
        "nothing from elsewhere"
    );
    let (_, vnodes) = http_get(&format!("http://{http}/status/jobs/page/vnodes"));
    let vnode_count = serde_json::from_str::<serde_json::Value>(&vnodes).unwrap()["vnodes"]
        .as_array()
        .unwrap()
        .len();

    let first = dom(&url, 2500);
    assert!(first.contains("data-job=\"page\""), "{first}");
    assert!(first.contains("job page"), "{first}");
    assert_eq!(
        first.matches("class=\"vnode ").count(),
        vnode_count,
        "one square per vnode"
    );
    assert!(refreshes(&first) >= 2, "the page refreshes itself: {first}");
    assert!(
        first.contains("<div id=\"problem\" class=\"error\"></div>"),
        "the page read /status: {first}"
    );

    // Later, the same page shows the job streaming: every square green.
    run.wait_for("to=\"streaming\"", Duration::from_secs(120));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let later = dom(&url, 1500);
        let streaming = later.matches("data-phase=\"streaming\"").count();
        if streaming == vnode_count {
            assert!(later.contains("class=\"phase streaming\""), "{later}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{streaming} of {vnode_count} squares streaming: {later}"
        );
    }

    let artifacts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("status-page.png");
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1280,900",
            "--virtual-time-budget=2000",
        ])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG at {}", shot.display());
    run.signal("TERM");
    assert!(run.wait_exit(Duration::from_secs(60)).success());
}
