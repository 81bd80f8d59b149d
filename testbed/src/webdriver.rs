//! A WebDriver client, just enough to use oxhorn's dashboard as a person
//! does (tests/it/dashboard, bench/scale.rs):
//! Debian's chromium, headless, driven by its chromedriver over the W3C
//! protocol on the loopback. Both processes end with the browser's drop.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

/// How long an element may take to appear.
const PATIENCE: Duration = Duration::from_secs(30);

/// The key a W3C element reference is under.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    /// Where screenshots go.
    pub shots: PathBuf,
    _profile: tempfile::TempDir,
}

/// An element of the page.
#[derive(Clone, Debug)]
pub struct Element(String);

impl Browser {
    /// A headless browser window of `width` x `height`, its screenshots
    /// kept in `shots`.
    pub async fn start(width: u32, height: u32, shots: &Path) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // In a process group of its own, which the browser joins, so that
        // both end together whatever happens to the test.
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (hack/install-test-deps.sh installs it)");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let profile = tempfile::tempdir().unwrap();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-extensions", "--disable-background-networking",
                    "--disable-sync", "--disable-default-apps", "--disable-component-update",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let mut answer = Value::Null;
        for _ in 0..100 {
            match json(http.post(format!("{base}/session")), Some(&capabilities)).await {
                Some(value) => {
                    answer = value;
                    break;
                }
                // Not listening yet.
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {answer}"))
            .to_owned();
        std::fs::create_dir_all(shots).unwrap();
        Self {
            driver,
            base,
            session,
            http,
            shots: shots.to_owned(),
            _profile: profile,
        }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let request = self.http.request(method, url);
        let answer = json(request, body.as_ref())
            .await
            .expect("chromedriver answers");
        if answer["value"]["error"].is_string() {
            panic!("WebDriver {path}: {}", answer["value"]);
        }
        answer["value"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.command(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn goto(&self, url: &str) {
        self.post("/url", json!({"url": url})).await;
    }

    pub async fn url(&self) -> String {
        let url = self.command(reqwest::Method::GET, "/url", None).await;
        url.as_str().unwrap().to_owned()
    }

    /// The first element `css` selects, if any.
    pub async fn find(&self, css: &str) -> Option<Element> {
        let url = format!("{}/session/{}/element", self.base, self.session);
        let body = json!({"using": "css selector", "value": css});
        let answer = json(self.http.post(url), Some(&body))
            .await
            .expect("chromedriver answers");
        answer["value"][ELEMENT]
            .as_str()
            .map(|id| Element(id.to_owned()))
    }

    /// How many elements `css` selects.
    pub async fn count(&self, css: &str) -> usize {
        let found = self
            .post("/elements", json!({"using": "css selector", "value": css}))
            .await;
        found.as_array().map_or(0, Vec::len)
    }

    /// The element `css` selects, which must be there.
    pub async fn get(&self, css: &str) -> Element {
        self.find(css)
            .await
            .unwrap_or_else(|| panic!("no element {css}"))
    }

    pub async fn click(&self, css: &str) {
        self.on_element(css, "click", json!({})).await;
    }

    /// Types `text` into the element `css` selects, after clearing it.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, "clear", json!({})).await;
        self.on_element(css, "value", json!({"text": text})).await;
    }

    /// `action` on the element `css` selects, found again if the page was
    /// rendered again meanwhile.
    async fn on_element(&self, css: &str, action: &str, body: Value) {
        for _ in 0..10 {
            let element = self.get(css).await;
            let url = format!(
                "{}/session/{}/element/{}/{action}",
                self.base, self.session, element.0
            );
            let answer = json(self.http.post(url), Some(&body))
                .await
                .expect("chromedriver answers");
            match answer["value"]["error"].as_str() {
                None => return,
                Some("stale element reference") => continue,
                Some(_) => panic!("WebDriver {action} on {css}: {}", answer["value"]),
            }
        }
        panic!("{css} kept changing under {action}");
    }

    /// The text of the element `css` selects, once there is one. Read in
    /// one step: a live page may be rendered again at any time.
    pub async fn text(&self, css: &str) -> String {
        let script =
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;";
        let text = self.poll(css, script).await;
        text.as_str().unwrap_or_default().to_owned()
    }

    /// Whether the element `css` selects is enabled, once there is one.
    pub async fn enabled(&self, css: &str) -> bool {
        let script =
            "const e = document.querySelector(arguments[0]); return e ? !e.disabled : null;";
        self.poll(css, script).await == json!(true)
    }

    /// What `script` returns for `css`, once not null.
    async fn poll(&self, css: &str, script: &str) -> Value {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let value = self
                .post("/execute/sync", json!({"script": script, "args": [css]}))
                .await;
            if !value.is_null() {
                return value;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("no element {css} on {}", self.url().await);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `script` in the page; its return value.
    pub async fn run(&self, script: &str) -> Value {
        self.post("/execute/async", json!({"script": script, "args": []}))
            .await
    }

    /// Saves a screenshot of the page as `name`.png; its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }

    pub async fn resize(&self, width: u32, height: u32) {
        self.post("/window/rect", json!({"width": width, "height": height}))
            .await;
    }

    pub async fn delete_cookies(&self) {
        self.command(reqwest::Method::DELETE, "/cookie", None).await;
    }
}

/// `request` sent with the JSON `body`: its JSON answer; `None` if the
/// driver did not answer.
async fn json(mut request: reqwest::RequestBuilder, body: Option<&Value>) -> Option<Value> {
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let text = request.send().await.ok()?.text().await.ok()?;
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

impl Browser {
    /// Closes the browser.
    pub async fn quit(self) {
        self.command(reqwest::Method::DELETE, "", None).await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.driver.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.driver.wait();
    }
}
