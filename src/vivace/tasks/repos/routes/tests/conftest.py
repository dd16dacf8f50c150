from datetime import date

import pytest

from routes.graph import Network
from routes.gtfs import load_feed
from routes.planner import Planner

TUESDAY = date(2024, 3, 5)


STOPS = """\
stop_id,stop_name,stop_lat,stop_lon,zone_id
A,Central,52.0000,4.0000,1
B,Market,52.0000,4.0100,1
C,Museum,52.0100,4.0100,2
D,Harbour,52.0200,4.0200,3
E,Park,52.0030,4.0100,1
F,Station,52.0100,4.0300,2
G,Airport,52.1000,4.1000,4
H,Ferry Pier,52.0205,4.0200,3
"""

ROUTES = """\
route_id,route_short_name,route_type
R1,1,3
R2,2,0
R3,3,3
R4,4,3
N1,N1,3
FY,Ferry,4
"""

CALENDAR = """\
service_id,monday,tuesday,wednesday,thursday,friday,saturday,sunday,start_date,end_date
WK,1,1,1,1,1,0,0,20240101,20241231
SAT,0,0,0,0,0,1,0,20240101,20241231
ALL,1,1,1,1,1,1,1,20240101,20241231
"""

CALENDAR_DATES = """\
service_id,date,exception_type
WK,20240101,2
SAT,20240101,1
"""

TRIPS = """\
route_id,service_id,trip_id,trip_headsign
R1,WK,1a,Harbour
R1,WK,1b,Harbour
R1,SAT,1s,Harbour
R2,WK,2a,Station
R2,WK,2b,Station
R3,WK,3a,Station
R4,WK,4a,Station
N1,ALL,n1,Airport
FY,WK,fa,Airport
FY,WK,fb,Airport
"""

STOP_TIMES = """\
trip_id,arrival_time,departure_time,stop_id,stop_sequence
1a,08:00,08:00,A,1
1a,08:05,08:05,B,2
1a,08:12,08:12,C,3
1a,08:20,08:20,D,4
1b,08:15,08:15,A,1
1b,08:20,08:20,B,2
1b,08:27,08:27,C,3
1b,08:35,08:35,D,4
1s,09:00,09:00,A,1
1s,09:10,09:10,D,2
2a,08:10,08:10,E,1
2a,08:18,08:18,F,2
2b,08:25,08:25,E,1
2b,08:33,08:33,F,2
3a,08:14,08:14,C,1
3a,08:17,08:17,F,2
4a,08:02,08:02,A,1
4a,08:40,08:40,F,2
n1,23:50,23:50,A,1
n1,24:30,24:31,D,2
n1,25:10,25:10,G,3
fa,08:23,08:23,H,1
fa,09:00,09:00,G,2
fb,09:10,09:10,H,1
fb,09:50,09:50,G,2
"""

TRANSFERS = """\
from_stop_id,to_stop_id,transfer_type,min_transfer_time
D,H,2,300
"""


@pytest.fixture
def feed() -> dict[str, str]:
    """The sample feed's files (name -> CSV text); tests may change them."""
    return {
        "stops.txt": STOPS,
        "routes.txt": ROUTES,
        "calendar.txt": CALENDAR,
        "calendar_dates.txt": CALENDAR_DATES,
        "trips.txt": TRIPS,
        "stop_times.txt": STOP_TIMES,
        "transfers.txt": TRANSFERS,
    }


@pytest.fixture
def timetable(feed):
    return load_feed(feed)


@pytest.fixture
def network(timetable):
    return Network.build(timetable, TUESDAY)


@pytest.fixture
def planner(network):
    return Planner(network)
